"""The dashboard's server over an in-memory registry (no browser): what each page shows (a job's system charts,
right-sizing hint and TensorBoard line too), escaping, the env values it hides, cancel's CSRF check, the log tail,
and that a warm jobs page makes no per-job GET."""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest

from jobplane.clouds.memory import MemoryCompute, MemoryStore
from jobplane.model import keys, metrics
from jobplane.model.metrics import Point
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.model.usage import AttemptUsage, InstanceSpan
from jobplane.ops import jobs
from jobplane.sdk.watch import TAIL_BYTES
from jobplane.store.registry import Registry
from jobplane.ui import data
from tests.helpers import WRITTEN, data_of, gpu_sample, in_line, member_store, ship_system
from tests.ui.apps import TestClient, over, served

pytestmark = pytest.mark.timeout(60)
TOKEN = "test-token"
EVIL = "<script>alert(1)</script>"
SPEC = """\
name: {name}
instance_type: t3.micro
run: python train.py
env:
  API_KEY: hunter2-secret
labels:
  team: vision
"""


def seed(reg: Registry, job_id: str, name: str = "demo", running: bool = True) -> None:
    reg.create_job(job_id, parse_spec(SPEC.format(name=name), job_id))
    if running:
        reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=["i-1"])
        reg.transition(job_id, State.RUNNING, expect=[State.LAUNCHING])


def log(reg: Registry, job_id: str, seq: int, text: str, attempt: int = 1, rank: int = 0) -> None:
    reg.store.put(reg.key(keys.log_chunk(data_of(reg, job_id), attempt, rank, seq)), text.encode(), "text/plain")


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def reg(store: MemoryStore) -> Registry:
    return Registry(store, "root")


@pytest.fixture
def client(reg: Registry) -> TestClient:
    return served(over(reg, MemoryCompute), csrf_token=TOKEN)


def test_the_jobs_page_lists_live_jobs_with_counts_and_filters(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    seed(reg, "beta", running=False)
    page = client.get("/").text
    assert 'data-job="alpha"' in page and 'data-job="beta"' in page
    assert re.search(r'data-state="RUNNING">running <b>1</b>', page)
    assert re.search(r'data-state="QUEUED">queued <b>1</b>', page)
    running = client.get("/fragments/jobs", params={"state": "RUNNING"}).text
    assert 'data-job="alpha"' in running and 'data-job="beta"' not in running
    assert 'data-job="alpha"' in client.get("/fragments/jobs", params={"label": "team=vision"}).text
    assert 'data-job="alpha"' not in client.get("/fragments/jobs", params={"label": "team=nlp"}).text
    assert 'data-job="beta"' not in client.get("/fragments/jobs", params={"q": "alph"}).text


def test_the_filters_put_the_page_s_own_url_in_the_address_bar(reg: Registry, client: TestClient) -> None:
    """htmx pushes the URL the filters ask (hx-push-url="true"): reloaded or bookmarked, it must be the page with
    its navigation and styles, not a bare table. The answer holds the table the form swaps in."""
    seed(reg, "alpha")
    seed(reg, "beta", running=False)
    form = re.search(r'<form id="filters"[^>]*>', client.get("/").text)
    assert form is not None
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', form.group(0)))
    asked = attrs["hx-get"] + "?" + urlencode({"state": "RUNNING", "owner": "", "label": "", "q": "", "sort": "age",
                                               "desc": ""})
    answer = client.get(asked, headers={"HX-Request": "true", "HX-Trigger": "filters"}).text
    table = re.search(r'<section id="jobs".*?</section>', answer, re.S)
    assert attrs["hx-target"] == attrs.get("hx-select", attrs["hx-target"]) == "#jobs" and table is not None
    assert 'data-job="alpha"' in table.group(0) and 'data-job="beta"' not in table.group(0)
    pushed = asked if attrs["hx-push-url"] == "true" else attrs["hx-push-url"]
    reloaded = client.get(pushed).text
    assert "<nav>" in reloaded and 'href="/static/app.css"' in reloaded
    assert "<option selected>RUNNING</option>" in reloaded
    assert 'data-job="alpha"' in reloaded and 'data-job="beta"' not in reloaded


def test_script_in_a_name_a_log_and_a_metric_is_text(reg: Registry, client: TestClient) -> None:
    seed(reg, "evil", name=EVIL)
    log(reg, "evil", 0, f"step 1 {EVIL}\n")
    reg.store.put(reg.key(keys.metrics_chunk(data_of(reg, "evil"), 1, 0, 0)),
                  metrics.encode(Point(EVIL, 1.0, 1), datetime.now(UTC)), "application/x-ndjson")
    for page in (client.get("/").text, client.get("/jobs/evil").text):
        assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    response = client.get("/jobs/evil")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    logs = client.get("/jobs/evil/logs", params={"attempt": 1, "rank": 0})
    assert logs.headers["content-type"] == "application/json" and EVIL in logs.json()["text"]  # the page sets text
    assert EVIL in client.get("/jobs/evil/metrics.json").json()  # JSON, read by script; never HTML
    compare = client.get("/compare", params={"id": "evil", "metric": EVIL}).text
    assert EVIL not in compare and "\\u003cscript\\u003e" in compare  # the embedded JSON cannot close its tag


def test_env_values_are_never_shown(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    page = client.get("/jobs/alpha").text
    assert "API_KEY" in page and "hunter2" not in page
    assert data.mask_env({"env": {"A": "x"}, "container": {"env": {"B": "y"}}}) == {
        "env": {"A": data.MASK}, "container": {"env": {"B": data.MASK}}}


def test_cancel_needs_a_post_with_the_token(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    assert client.get("/jobs/alpha/cancel").status_code == 405
    assert client.post("/jobs/alpha/cancel", data={"csrf": "wrong"}).status_code == 403
    assert client.post("/jobs/alpha/cancel", data={}).status_code == 403
    assert client.post("/jobs/alpha/cancel", data={"csrf": TOKEN},
                       headers={"origin": "http://evil.example"}).status_code == 403
    assert reg.job("alpha").state == State.RUNNING
    done = client.post("/jobs/alpha/cancel", data={"csrf": TOKEN}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/jobs/alpha"
    assert reg.job("alpha").state == State.CANCELLED
    assert 'name="csrf"' not in client.get("/jobs/alpha").text  # a finished job has no cancel button


def test_a_first_log_view_is_its_tail_and_then_only_new_chunks(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    line = "x" * 99 + "\n"
    for seq in range(40):  # 40 chunks of 10 KB: 400 KB, more than the tail a first view gets
        log(reg, "alpha", seq, f"chunk {seq}\n" + line * 100)
    first = client.get("/jobs/alpha/logs", params={"attempt": 1, "rank": 0}).json()
    assert first["skipped"] > 0 and len(first["text"]) <= TAIL_BYTES and first["cursor"] == 40
    assert first["text"].startswith(f"chunk {first['skipped']}\n") and "chunk 39\n" in first["text"]
    log(reg, "alpha", 40, "the newest line\n")
    more = client.get("/jobs/alpha/logs", params={"attempt": 1, "rank": 0, "cursor": 40}).json()
    assert more == {"text": "the newest line\n", "cursor": 41, "skipped": 0, "live": True}


def test_a_warm_jobs_page_makes_no_per_job_get(reg: Registry, store: MemoryStore, client: TestClient) -> None:
    for i in range(30):
        seed(reg, f"job-{i}")
    client.get("/")
    before = dict(store.calls)
    client.get("/", params={"all": "1"})
    gets = store.calls.get("get", 0) - before.get("get", 0)
    assert gets == 0, f"a warm jobs page made {gets} GETs"
    reg.update("job-3", reason="changed")
    before = dict(store.calls)
    assert "changed" in client.get("/").text
    assert store.calls.get("get", 0) - before.get("get", 0) == 1  # only the record whose listing entry changed


def test_a_warm_jobs_page_lists_pages_per_job_not_per_object_a_job_wrote(reg: Registry, store: MemoryStore,
                                                                        client: TestClient) -> None:
    """Log chunks, metric chunks and events cost a warm page no listing page: jobs/ is listed with a delimiter."""
    for i in range(3):
        seed(reg, f"job-{i}")

    def lists() -> int:
        before = dict(store.calls)
        client.get("/", params={"all": "1"})
        return store.calls.get("list", 0) - before.get("list", 0)

    lists()
    quiet = lists()
    for seq in range(2500):  # 2.5 pages of keys, were they listed
        log(reg, "job-1", seq, "x\n")
        store.put(reg.key(keys.metrics_chunk(data_of(reg, "job-2"), 1, 0, seq)), b"{}")
    assert lists() == quiet


def test_a_watched_record_is_read_again_whenever_it_may_have_changed(reg: Registry, store: MemoryStore) -> None:
    """A transition moves the marker and an update touches it; an ended job's record is read once; a live record
    without its marker (its writer died between the two writes) and a debug hold's open usage on every look."""
    seed(reg, "alpha")
    reg.create_job("held", parse_spec(SPEC.format(name="held"), "held"))
    billed = AttemptUsage(attempt=1, instance_type="t3.micro", market="on-demand",
                          instances=[InstanceSpan(id="i-2", start=datetime.now(UTC))])
    reg.transition("held", State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=["i-2"], usage=[billed])
    reg.transition("held", State.RUNNING, expect=[State.LAUNCHING])
    watch = over(reg, MemoryCompute).watch()

    def look() -> tuple[dict[str, str], int]:
        before = store.calls.get("get", 0)
        states = {job.id: f"{job.view.state}:{job.view.reason or ''}" for job in watch.jobs(True)}
        return states, store.calls.get("get", 0) - before

    assert look()[1] == 2 and look()[1] == 0
    reg.update("alpha", reason="spot warning")
    assert look() == ({"alpha": "RUNNING:spot warning", "held": "RUNNING:"}, 1)
    reg.transition("alpha", State.SUCCEEDED, expect=[State.RUNNING], reason="done")
    assert look() == ({"alpha": "SUCCEEDED:done", "held": "RUNNING:"}, 1)
    assert look()[1] == 0
    reg.delete(keys.active_marker("held", State.RUNNING, 1))  # as if its writer had died before writing it
    assert look()[1] == 1 and look()[1] == 1
    reg.repair_markers("held")
    assert look()[1] == 1 and look()[1] == 0
    reg.transition("held", State.FAILED, expect=[State.RUNNING], reason="exit 1",
                   held_until=datetime.now(UTC) + timedelta(hours=1))
    assert look()[1] == 1 and look()[1] == 1  # its VMs still count
    reg.close_usage("held", now=datetime.now(UTC))
    assert look()[1] == 1 and look()[1] == 0


def test_the_cost_page_groups_by_owner_and_label(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    for by in ("owner", "type", "market", "job"):
        assert client.get("/cost", params={"by": by, "period": "all"}).status_code == 200
    page = client.get("/cost", params={"by": "label", "label": "team", "period": "30d"}).text
    assert "TEAM" in page


def budgets(reg: Registry) -> None:
    """Two owners with budgets this month: team-a over its $50 ($63.20 spent), team-b at $4.10 of its $10 (41%)."""
    month = f"{datetime.now(UTC):%Y-%m}"
    reg.put(keys.POLICY, b"budgets: {monthly_usd: {team-a: 50, team-b: 10}, warn_at_percent: 80, "
                         b"on_exceeded_by_owner: {team-a: wait}}\n")
    for owner, spent in (("team-a", 63.2), ("team-b", 4.1)):
        reg.put_json(keys.admission_owner(owner), {"version": 1, "owner": owner, "month": month, "spent": spent})


def test_the_cost_page_shows_each_budget_spent_of_limit_with_the_owners_over_it_marked(
        reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    budgets(reg)
    page = client.get("/cost", params={"by": "owner", "period": "all"}).text
    section = page[page.index('id="budgets"'):page.index("</section>", page.index('id="budgets"'))]
    over, under = section.split('<div class="budget')[1:]
    assert " over" in over.split('"')[0] and "team-a" in over and "over budget" in over
    assert "$63.20 of $50.00" in over and "new jobs wait until" in over
    assert "team-b" in under and "over budget" not in under and "$4.10 of $10.00" in under
    assert "new jobs refused at 100%" in under
    assert section.count('class="warn"') == 2 and "warn line (80%)" in section
    queue = client.get("/queue").text
    rows = dict(re.findall(r'<tr data-owner="([^"]+)">(.*?)</tr>', queue, flags=re.S))
    assert "over budget" in rows["team-a"] and "new jobs wait until" in rows["team-a"]
    assert "over budget" not in rows["team-b"] and "$4.10 of $10.00 this month (41%)" in rows["team-b"]


def test_an_unknown_job_is_a_404(client: TestClient) -> None:
    assert client.get("/jobs/nope").status_code == 404
    assert client.get("/jobs/Not_An_Id/logs").status_code == 404


def test_the_timeline_names_each_transition(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    later = datetime.now(UTC) + timedelta(seconds=1)
    reg.transition("alpha", State.PREEMPTED, expect=[State.RUNNING], reason="spot interruption", now=later)
    page = client.get("/jobs/alpha").text
    states = re.findall(r'data-state="([A-Z_]*)"><time>', page)
    assert states == ["QUEUED", "LAUNCHING", "RUNNING", "PREEMPTED"], states


def test_a_page_renders_at_most_its_limit_of_rows_and_says_how_many_match(reg: Registry, client: TestClient) -> None:
    for i in range(3):
        seed(reg, f"job-{i}")
    page = client.get("/", params={"limit": 2}).text
    assert page.count('<tr data-job="') == 2 and "2 of 3 shown (3 match" in page


def test_the_step_is_the_x_axis_not_a_chart(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    points = [Point("step", 10.0, 10), Point("loss", 0.5, 10), Point("step", 20.0, 20), Point("loss", 0.25, 20)]
    reg.store.put(reg.key(keys.metrics_chunk(data_of(reg, "alpha"), 1, 0, 0)),
                  b"".join(metrics.encode(p, datetime.now(UTC)) for p in points), "application/x-ndjson")
    charts = client.get("/jobs/alpha/metrics.json").json()
    assert list(charts) == ["loss"]
    assert charts["loss"] | {"rank": 0} == {"x": [10.0, 20.0], "attempts": [1], "points": 2, "rank": 0,
                                            "series": [[0.5, 0.25]]}


def test_jobplane_ui_serves_on_loopback_and_warns_for_another_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from click.testing import CliRunner

    from jobplane.cli import cli

    bound: list[tuple[str, int]] = []
    def run(self: uvicorn.Server, sockets: list[socket.socket]) -> None:
        bound.append(sockets[0].getsockname()[:2])
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setenv("JOBPLANE_BUCKET", "s3://jobplane-ui-test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    done = CliRunner().invoke(cli, ["ui", "--port", "0"])
    assert done.exit_code == 0, done.output
    assert bound[0][0] == "127.0.0.1" and f"http://127.0.0.1:{bound[0][1]}/" in done.output
    assert "warning" not in done.output
    done = CliRunner().invoke(cli, ["ui", "--port", "0", "--host", "0.0.0.0"])
    assert done.exit_code == 0, done.output
    assert bound[1][0] == "0.0.0.0" and "warning: serving on 0.0.0.0, not loopback" in done.output


def test_the_table_has_the_facts_jobplane_ls_has(reg: Registry) -> None:
    seed(reg, "alpha")
    seed(reg, "beta", running=False)
    seed(reg, "gamma")
    reg.transition("gamma", State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0")
    reg.put_if_absent(keys.queue_entry("delta", "vision"), SPEC.format(name="delta").encode(), "application/yaml")
    reg.put_json(keys.rejected_error("epsilon"), {"reason": "duplicate id"})
    now = datetime.now(UTC)
    watch = over(reg, MemoryCompute).watch()
    for include_done in (False, True):
        ours = {row.id: row.cells for row in data.rows(watch.jobs(True), include_done, now)}
        ls = {row["id"]: row for row in jobs.list_rows(reg, include_done, now)}
        assert ours == ls


def test_the_first_page_keeps_the_jobs_that_ended_in_the_last_day_muted(reg: Registry, client: TestClient) -> None:
    """A user who submits, waits and then opens the dashboard finds the job; a day on, only "older finished too"
    shows it."""
    seed(reg, "alpha")
    seed(reg, "gamma")
    reg.transition("gamma", State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0")
    reg.put_json(keys.rejected_error("epsilon"), {"reason": "duplicate id"})
    page = client.get("/").text
    assert '<tr data-job="alpha" class="state-RUNNING">' in page
    assert '<tr data-job="gamma" class="state-SUCCEEDED ended">' in page
    assert '<tr data-job="epsilon" class="state-INVALID ended">' in page
    assert 'data-job="gamma"' in client.get("/fragments/jobs", params={"state": "SUCCEEDED"}).text
    assert 'data-job="gamma"' not in client.get("/fragments/jobs", params={"state": "RUNNING"}).text
    watch = over(reg, MemoryCompute).watch()
    tomorrow = datetime.now(UTC) + data.RECENT + timedelta(minutes=1)
    assert [row.id for row in data.rows(watch.jobs(True), False, tomorrow, data.RECENT)] == ["alpha"]
    assert {row.id for row in data.rows(watch.jobs(True), True, tomorrow, data.RECENT)} == {"alpha", "gamma", "epsilon"}
    nothing = client.get("/", params={"q": "no-such-job"}).text
    assert "No jobs running, queued or ended in the last 24 h (tick “older finished too” for the rest)." in nothing


def test_a_request_naming_another_host_is_refused(reg: Registry, client: TestClient) -> None:
    """A page on a name rebound to 127.0.0.1 (DNS rebinding) sends its own name as Host: nothing is served to it."""
    seed(reg, "alpha")
    for path in ("/", "/jobs/alpha", "/jobs/alpha/logs", "/jobs/alpha/metrics.json"):
        assert client.get(path, headers={"host": "evil.example:8765"}).status_code == 400, path
    assert client.post("/jobs/alpha/cancel", data={"csrf": TOKEN}, headers={"host": "evil.example"}).status_code == 400
    assert client.get("/", headers={"host": "localhost:8765"}).status_code == 200
    assert reg.job("alpha").state == State.RUNNING


def test_the_table_sorts_by_a_column_either_way(reg: Registry, client: TestClient) -> None:
    for job_id in ("bravo", "alpha", "charlie"):
        seed(reg, job_id)

    def order(**params: str) -> list[str]:
        return re.findall(r'<tr data-job="([a-z-]+)"', client.get("/fragments/jobs", params=params).text)

    assert order(sort="id") == ["alpha", "bravo", "charlie"]
    assert order(sort="id", desc="1") == ["charlie", "bravo", "alpha"]
    assert order(sort="age") == ["charlie", "alpha", "bravo"]  # the newest first
    assert order(sort="not-a-column") == order(sort="age")


def test_the_files_panel_follows_a_running_jobs_checkpoints(reg: Registry, client: TestClient) -> None:
    seed(reg, "alpha")
    assert 'hx-get="/jobs/alpha/files"' in client.get("/jobs/alpha").text
    checkpoints = keys.checkpoints_prefix(data_of(reg, "alpha"))
    reg.store.put(reg.key(checkpoints + "files/0/00000001-a1/ckpt-10.npz"), b"x" * 2048)
    panel = client.get("/jobs/alpha/files").text
    assert "files/0/00000001-a1/ckpt-10.npz" in panel and "2.0 KB" in panel and "1 objects" in panel
    reg.transition("alpha", State.SUCCEEDED, expect=[State.RUNNING])
    assert "hx-get" not in client.get("/jobs/alpha/files").text  # a finished job's files stop being polled


def test_the_job_page_charts_system_metrics_and_says_how_to_open_tensorboard(reg: Registry, client: TestClient) -> None:
    board = "tensorboard: {log_dir: /opt/ml/output/tensorboard}\n"
    reg.create_job("sized", parse_spec(SPEC.format(name="sized") + board, "sized"))
    reg.transition("sized", State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=["i-1", "i-2"])
    reg.transition("sized", State.RUNNING, expect=[State.LAUNCHING])
    page = client.get("/jobs/sized").text
    assert 'id="system" data-job="sized" data-live="1"' in page and "the agent samples every 15 s" in page
    assert "<code>jobplane tensorboard sized</code>" in page and 'id="right-sizing"' not in page  # still running
    assert client.get("/jobs/sized/system.json").json() == []

    ship_system(reg, "sized", 1, 0, 0, [gpu_sample(12, 4.0), gpu_sample(20, 5.0)])
    ship_system(reg, "sized", 1, 1, 0, [gpu_sample(16, 3.0)], first=15)
    charts = {c["key"]: c for c in client.get("/jobs/sized/system.json").json()}
    assert list(charts) == ["cpu", "memory", "disk", "gpu", "gpu_memory", "gpu_power"]  # the kinds with points
    gpu = charts["gpu"]
    start = WRITTEN.timestamp()
    assert gpu["title"] == "GPU utilization (%)" and gpu["labels"] == ["gpu0", "gpu0 [rank 1]"]
    assert gpu["x"] == [start, start + 15] and gpu["series"] == [[12.0, 20.0], [None, 16.0]] and gpu["points"] == 3

    reg.transition("sized", State.SUCCEEDED, expect=[State.RUNNING], reason="exit 0")
    page = client.get("/jobs/sized").text
    hint = "GPU utilization averaged 16%, memory 5 of 24 GB: a smaller instance may do"
    assert f'<p class="hint" id="right-sizing">{hint}</p>' in page and 'data-live=""' in page
    seed(reg, "plain")
    page = client.get("/jobs/plain").text
    assert "jobplane tensorboard" not in page and 'id="system"' in page


def test_the_queue_page_shows_each_owners_usage_and_where_each_waiting_job_stands(reg: Registry,
                                                                                  client: TestClient) -> None:
    reg.put(keys.POLICY, b"max_active_instances_per_owner: 1\nmax_active_instances: 4\nmax_active_by_family: {t3: 3}\n"
                         b"owner_weights: {vision: 3}\npriority_classes: {urgent: {value: 100}}\n"
                         b"budgets: {monthly_usd: {vision: 100}}\n")
    text = SPEC.format(name="demo")
    in_line(reg, [("holds", text, 0), ("first", text + "priority: urgent\n", 100), ("second", text, 0)], quota=1,
            now=datetime.now(UTC))
    in_line(reg, [("other", text.replace("team: vision", "team: nlp") + "owner: nlp\n", 0)], quota=1,
            now=datetime.now(UTC))
    page = client.get("/queue").text
    assert page.index('data-job="first"') < page.index('data-job="second"') and 'data-job="holds"' not in page
    assert ("1 earlier job of owner &#39;default&#39; waits first (first next, priority 100); 1 of 1 nodes in use "
            "(max_active_instances_per_owner)") in page
    assert re.search(r'data-job="first">.*?<td>urgent</td>', page), "a priority by its class's name"
    usage = page[page.index('id="usage"'):page.index("<h2>Waiting</h2>")]
    rows = re.findall(r'<tr data-owner="([^"]+)">(.*?)</tr>', usage, flags=re.S)
    cells = {owner: [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
             for owner, row in rows}
    # a fair share among the owners holding or waiting for nodes (4 x 1 / 2); an idle one's, if it came (4 x 3 / 5)
    assert cells == {"default": ["default", "1 of 1", "2", "1", "2.0 of 4", "-"],
                     "nlp": ["nlp", "1 of 1", "0", "1", "2.0 of 4", "-"],
                     "vision": ["vision", "0 of 1", "0", "3", "2.4 of 4", "$0.00 of $100.00 this month (0%)"]}, cells
    assert "Deployment cap: 0 of 4 nodes in use (max_active_instances)" in usage  # in_line writes owners' records
    assert "Family t3: 0 of 3 nodes in use (max_active_by_family.t3)" in usage
    other = client.get("/queue", params={"owner": "team-b"}).text
    assert "No job waits for owner team-b" in other and 'data-owner="team-b"' in other


def test_a_page_prices_only_the_rows_it_shows(reg: Registry, client: TestClient,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job's page at 10,000 jobs renders 500: age, runtime and cost move with the clock, so each view
    computes them again, and only the sort's column is needed for every row (bench/ui.py's ?all=1)."""
    from jobplane.views import cost

    for i in range(5):
        seed(reg, f"job-{i}")
    priced: list[str] = []
    real = cost.job_cost

    def counted(record, now):  # type: ignore[no-untyped-def]
        priced.append(record.id)
        return real(record, now)

    monkeypatch.setattr(cost, "job_cost", counted)
    page = client.get("/", params={"all": "1", "limit": "2"}).text
    shown = re.findall(r'<tr data-job="([^"]+)"', page)
    assert shown == ["job-4", "job-3"]  # the newest first
    assert sorted(priced) == sorted(shown)
    oldest = client.get("/", params={"all": "1", "limit": "2", "sort": "age", "desc": "1"}).text
    assert re.findall(r'<tr data-job="([^"]+)"', oldest) == ["job-0", "job-1"]
    priced.clear()
    by_cost = client.get("/", params={"all": "1", "limit": "2", "sort": "cost"}).text
    by_cost = re.findall(r'<tr data-job="([^"]+)"', by_cost)
    assert len(by_cost) == 2 and len(priced) == 5 + 2  # sorting by cost prices every row once, then the shown again


def test_a_team_member_sees_another_teams_job_but_not_its_output_metrics_or_samples(reg: Registry) -> None:
    """Under a team member's credentials (the submitter policy, tests.helpers.member_store) the page of another
    team's job shows its record and says whose it is where its output and charts would be."""
    seed(reg, "theirs")  # the default owner's: not team-a's
    log(reg, "theirs", 0, "step 1 loss 0.5\n")
    reg.store.put(reg.key(keys.metrics_chunk(data_of(reg, "theirs"), 1, 0, 0)),
                  metrics.encode(Point("loss", 0.5, 1), WRITTEN), "application/x-ndjson")
    member = Registry(member_store(reg.store, "team-a", root="root"), reg.root)
    client = served(over(member, lambda: MemoryCompute()), csrf_token=TOKEN)
    page = client.get("/jobs/theirs")
    assert page.status_code == 200 and "theirs" in page.text
    logs = client.get("/jobs/theirs/logs").json()
    assert logs["text"] == "" and logs["refused"].startswith("job theirs belongs to default:")
    charts = client.get("/jobs/theirs/metrics.json")
    assert charts.status_code == 403 and "belongs to default" in charts.json()["refused"]
    cancel = client.post("/jobs/theirs/cancel", data={"csrf": TOKEN})
    assert cancel.status_code == 409 and "belongs to default" in cancel.text
    assert reg.job("theirs").state == State.RUNNING
