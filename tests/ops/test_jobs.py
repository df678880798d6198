"""Job operations over an in-memory registry: a queued job is a job, status lines, following to a goal on a fake
clock, cancelling a queued job, artifacts by their manifests. The launcher interplay on moto is in
tests/control/launcher/test_cancel.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobplane.clouds.memory import MemoryCompute, MemoryStore
from jobplane.model import keys
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.ops import cancels, jobs
from jobplane.store.registry import JobNotFound, Registry
from jobplane.views.jobview import JobView, status, view_row
from tests.helpers import WRITTEN, data_of, publish

T0 = datetime(2026, 11, 22, 11, 30, 0, tzinfo=UTC)
SPEC = "name: demo\ninstance_type: t3.micro\nnum_nodes: 2\nspot: true\nrun: python3 train.py\n"


class Clock:
    """Wall and monotonic time that move only when the code under test sleeps."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reg(clock: Clock) -> Registry:
    return Registry(MemoryStore(clock=clock.now), "root")


def drop(reg: Registry, job_id: str, text: str = SPEC) -> str:
    key = keys.queue_entry(job_id)
    reg.store.put(reg.key(key), text.encode(), "application/yaml")
    return key


def take(reg: Registry, job_id: str, now: datetime) -> None:
    """What the launcher does with a drop: record the job, claim attempt 1, then delete the drop."""
    reg.create_job(job_id, parse_spec(reg.get_bytes(keys.queue_entry(job_id)), job_id=job_id), now)
    reg.transition(job_id, State.LAUNCHING, now=now, expect={State.QUEUED}, attempt=1)
    reg.delete(keys.queue_entry(job_id))


# ---- finding and listing -----------------------------------------------------------------------------------
def test_a_drop_in_queue_is_a_queued_job_with_its_spec_and_wait(reg: Registry, clock: Clock) -> None:
    drop(reg, "demo-1")
    clock.t = 7
    view = jobs.find(reg, "demo-1")
    assert view.state == State.QUEUED and view.record is None and view.drop == "queue/demo-1.yaml"
    assert view.spec is not None and view.spec.num_nodes == 2 and view.spec.id == "demo-1"
    assert status(view, clock.now()).text == "queued 7s: waiting for the launcher"
    row = view_row(view, clock.now())
    assert (row["state"], row["age"], row["nodes"], row["instance_type"], row["spot"]) == ("QUEUED", 7, 2,
                                                                                        "t3.micro", True)


def test_find_prefers_the_record_and_knows_rejections(reg: Registry, clock: Clock) -> None:
    drop(reg, "demo-2")
    take(reg, "demo-2", clock.now())
    assert jobs.find(reg, "demo-2").state == State.LAUNCHING
    reg.put_json(keys.rejected_error("bad"), {"errors": [{"field": "run", "message": "required field is missing"}]})
    bad = jobs.find(reg, "bad")
    assert bad.state == State.INVALID and bad.reason == "run: required field is missing"
    for unknown in ("nope", "Not An Id", "../jobs"):
        with pytest.raises(JobNotFound, match="no job"):
            jobs.find(reg, unknown)


def test_a_drop_the_launcher_will_reject_is_queued_with_the_reason(reg: Registry) -> None:
    drop(reg, "broken", "instance_type: t3.micro\nnum_nodes: 0\n")
    view = jobs.find(reg, "broken")
    assert view.state == State.QUEUED and view.spec is None
    assert "the launcher will reject it" in (view.reason or "") and "num_nodes" in (view.reason or "")
    with pytest.raises(jobs.JobError, match="spec is invalid"):
        cancels.cancel(reg, "broken")


def test_ls_lists_queued_drops_once_and_their_records_after(reg: Registry, clock: Clock) -> None:
    drop(reg, "first")
    clock.t = 5
    drop(reg, "second")
    take(reg, "second", clock.now())
    clock.t = 9
    rows = {r["id"]: r for r in jobs.list_rows(reg, include_done=False, now=clock.now())}
    assert rows["first"]["state"] == "QUEUED" and rows["first"]["age"] == 9
    assert rows["second"]["state"] == "LAUNCHING" and len(rows) == 2
    assert [r["id"] for r in jobs.list_rows(reg, include_done=True, now=clock.now())] == ["first", "second"]


def test_ls_all_lists_a_page_per_thousand_jobs_not_per_object_they_wrote(reg: Registry, clock: Clock) -> None:
    """jobs/ is listed with a delimiter: 2,500 log chunks cost `jobplane ls --all` no listing page, and a drop whose
    code bundle is in jobs/<id>/code/ before its record exists is still listed, queued."""
    store = reg.store
    assert isinstance(store, MemoryStore)
    drop(reg, "first")
    take(reg, "first", clock.now())
    drop(reg, "second")
    reg.put(keys.code_bundle(data_of(reg, "second")), b"bundle")

    def pages() -> tuple[int, list[tuple[str, str]]]:
        before = store.calls.get("list", 0)
        rows = [(r["id"], r["state"]) for r in jobs.list_rows(reg, include_done=True, now=clock.now())]
        return store.calls.get("list", 0) - before, rows

    quiet, rows = pages()
    assert sorted(rows) == [("first", "LAUNCHING"), ("second", "QUEUED")]
    for seq in range(2500):
        reg.put(keys.log_chunk(data_of(reg, "first"), 1, 0, seq), b"x\n")
    assert pages() == (quiet, rows)


# ---- status lines and exit codes ----------------------------------------------------------------------------
def test_status_lines_follow_the_job(reg: Registry, clock: Clock) -> None:
    drop(reg, "walk")
    seen = [status(jobs.find(reg, "walk"), clock.now())]
    take(reg, "walk", clock.now())
    seen.append(status(jobs.find(reg, "walk"), clock.now()))
    reg.transition("walk", State.LAUNCHING, expect={State.LAUNCHING}, instances=["i-0a", "i-0b"])
    clock.t = 4
    seen.append(status(jobs.find(reg, "walk"), clock.now()))
    reg.transition("walk", State.RUNNING, now=clock.now())
    seen.append(status(jobs.find(reg, "walk"), clock.now()))
    reg.transition("walk", State.SUCCEEDED, reason="every rank exited 0")
    seen.append(status(jobs.find(reg, "walk"), clock.now()))
    assert [s.text for s in seen] == [
        "queued 0s: waiting for the launcher",
        "launching attempt 1",
        "launching attempt 1 on i-0a, i-0b: waiting for the first heartbeat (4s)",
        "running attempt 1 on i-0a, i-0b",
        "SUCCEEDED: every rank exited 0",
    ]
    assert len({s.phase for s in seen}) == 5


def test_a_waiting_status_keeps_its_phase_as_seconds_pass() -> None:
    view = JobView("j", State.QUEUED, T0)
    assert status(view, T0).phase == status(view, T0 + timedelta(seconds=30)).phase
    assert status(view, T0).text != status(view, T0 + timedelta(seconds=30)).text


def test_goals() -> None:
    assert jobs.reached(jobs.Goal.RUNNING, State.RUNNING) and jobs.reached(jobs.Goal.RUNNING, State.FAILED)
    assert not jobs.reached(jobs.Goal.RUNNING, State.LAUNCHING)
    assert not jobs.reached(jobs.Goal.TERMINAL, State.RUNNING) and jobs.reached(jobs.Goal.TERMINAL, State.CANCELLED)


# ---- following ----------------------------------------------------------------------------------------------
Step = Callable[[], object]


def chunk(reg: Registry, job_id: str, rank: int, seq: int, text: str) -> None:
    reg.store.put(reg.key(keys.log_chunk(data_of(reg, job_id), 1, rank, seq)), text.encode())


def story(reg: Registry, clock: Clock, job_id: str, ending: State) -> list[Step]:
    """Each fake sleep moves the job one step: launched, running with output, output, the ending."""
    steps = [
        lambda: take(reg, job_id, clock.now()),
        lambda: reg.transition(job_id, State.LAUNCHING, expect={State.LAUNCHING}, instances=["i-1", "i-2"]),
        lambda: (reg.transition(job_id, State.RUNNING), chunk(reg, job_id, 0, 0, "rank 0 starts\n"),
                 chunk(reg, job_id, 1, 0, "rank 1 says hi\n")),
        lambda: chunk(reg, job_id, 0, 1, "step 1\n"),
        lambda: (reg.put_json(keys.exit_report(job_id, 1, 0), {"code": 0}),
                 reg.put_json(keys.exit_report(job_id, 1, 1), {"code": 0}),
                 reg.transition(job_id, ending, reason="the end")),
    ]
    return steps


def queued(job_id: str) -> keys.JobData:
    """Where a job not recorded yet will keep its logs: its owner's folder (the SDK's Job.data says so too)."""
    return keys.JobData(job_id, keys.DEFAULT_OWNER)


def run_follow(reg: Registry, clock: Clock, job_id: str, goal: jobs.Goal, steps: list[Step],
               timeout: float | None = None) -> tuple[JobView, list[str], list[jobs.Chunk]]:
    statuses: list[str] = []
    chunks: list[jobs.Chunk] = []

    def sleep(seconds: float) -> None:
        clock.t += seconds
        if steps:
            steps.pop(0)()

    how = jobs.Follow(on_status=lambda s: statuses.append(s.text), on_chunk=chunks.append,
                      logs=jobs.LogReader(reg, queued(job_id)), interval=1.0, timeout=timeout,
                      clock=clock.monotonic, sleep=sleep, now=clock.now)
    return jobs.follow(reg, job_id, goal, how), statuses, chunks


@pytest.mark.parametrize("ending", [State.SUCCEEDED, State.FAILED])
def test_follow_waits_through_queue_and_launch_then_streams_to_the_end(reg: Registry, clock: Clock,
                                                                       ending: State) -> None:
    drop(reg, "story")
    view, statuses, chunks = run_follow(reg, clock, "story", jobs.Goal.TERMINAL, story(reg, clock, "story", ending))
    assert view.state == ending
    assert statuses[0] == "queued 0s: waiting for the launcher" and statuses[1] == "launching attempt 1"
    assert statuses[-1] == "running attempt 1 on i-1, i-2"  # the ending is the caller's to report
    assert [(c.attempt, c.rank, c.text) for c in chunks] == [(1, 0, "rank 0 starts\n"), (1, 1, "rank 1 says hi\n"),
                                                             (1, 0, "step 1\n")]


def test_following_yields_the_chunks_and_returns_the_view(reg: Registry, clock: Clock) -> None:
    drop(reg, "gen")
    steps, statuses = story(reg, clock, "gen", State.SUCCEEDED), list[str]()

    def sleep(seconds: float) -> None:
        clock.t += seconds
        if steps:
            steps.pop(0)()

    how = jobs.Follow(on_status=lambda s: statuses.append(s.text), logs=jobs.LogReader(reg, queued("gen")),
                      sleep=sleep, clock=clock.monotonic, now=clock.now)
    following = jobs.following(reg, "gen", jobs.Goal.TERMINAL, how)
    texts = []
    with pytest.raises(StopIteration) as done:
        while True:
            texts.append(next(following).text)
    assert texts == ["rank 0 starts\n", "rank 1 says hi\n", "step 1\n"] and done.value.value.state == State.SUCCEEDED
    assert statuses[0] == "queued 0s: waiting for the launcher"


def test_follow_to_running_stops_there(reg: Registry, clock: Clock) -> None:
    drop(reg, "up")
    view, statuses, _ = run_follow(reg, clock, "up", jobs.Goal.RUNNING, story(reg, clock, "up", State.SUCCEEDED))
    assert view.state == State.RUNNING and statuses[-1] == "launching attempt 1 on i-1, i-2: waiting for the " \
                                                          "first heartbeat (1s)"


def test_follow_gives_up_at_the_timeout_saying_what_it_saw(reg: Registry, clock: Clock) -> None:
    drop(reg, "stuck")
    with pytest.raises(jobs.WaitTimedOut) as err:
        run_follow(reg, clock, "stuck", jobs.Goal.TERMINAL, [], timeout=5)
    assert str(err.value) == "timed out after 5s waiting for stuck to be terminal: it is QUEUED"
    assert clock.t == 5


def test_follow_of_no_job_fails_at_once(reg: Registry, clock: Clock) -> None:
    with pytest.raises(JobNotFound):
        run_follow(reg, clock, "ghost", jobs.Goal.TERMINAL, [])
    assert clock.t == 0


def test_a_finished_job_is_drained_until_every_node_reported(reg: Registry, clock: Clock) -> None:
    drop(reg, "late")
    take(reg, "late", clock.now())
    reg.transition("late", State.LAUNCHING, expect={State.LAUNCHING}, instances=["i-1"])
    reg.transition("late", State.CANCELLED, reason="cancelled by the user")
    steps: list[Step] = [lambda: chunk(reg, "late", 0, 0, "saving\n"),
                           lambda: reg.put_json(keys.exit_report("late", 1, 0), {"code": 143})]
    view, _, chunks = run_follow(reg, clock, "late", jobs.Goal.TERMINAL, steps)
    assert view.state == State.CANCELLED and [c.text for c in chunks] == ["saving\n"]
    assert jobs.drained(reg, view.record, None)


# ---- cancelling -----------------------------------------------------------------------------------------------
def test_cancel_of_a_queued_job_records_it_cancelled_and_consumes_the_drop(reg: Registry) -> None:
    drop(reg, "cancel-me")
    done = cancels.cancel(reg, "cancel-me")
    assert done.before_launch and done.record.state == State.CANCELLED and done.terminated == ()
    assert [k for k, _, _ in reg.listing(keys.QUEUE)] == []
    assert reg.job("cancel-me").spec.num_nodes == 2
    assert jobs.find(reg, "cancel-me").state == State.CANCELLED
    with pytest.raises(jobs.JobError, match="already CANCELLED"):
        cancels.cancel(reg, "cancel-me")


def test_cancel_force_reports_the_vms_it_found_even_when_the_agent_powers_off_first(
        reg: Registry, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    compute = MemoryCompute(clock.now)
    drop(reg, "forced")
    take(reg, "forced", clock.now())
    vm, bystander = compute.add("forced", attempt=1), compute.add("other", attempt=1)
    reg.transition("forced", State.LAUNCHING, expect={State.LAUNCHING}, instances=[vm])
    reg.transition("forced", State.RUNNING)
    stop = reg.request_stop

    def agent_stops_at_once(job_id: str, **kwargs: Any) -> None:  # before the CLI could list the job's VMs
        stop(job_id, **kwargs)
        compute.reclaim(vm)

    monkeypatch.setattr(reg, "request_stop", agent_stops_at_once)
    done = cancels.cancel(reg, "forced", force=True, compute=lambda: compute)
    assert done.started and done.record.state == State.CANCELLED and done.terminated == (vm,)
    assert compute.state(vm) == "shutting-down" and [i.id for i in compute.list_managed()] == [bystander]


def test_submit_plan_checks_the_spec_before_anything_is_uploaded(tmp_path) -> None:
    spec = tmp_path / "job.yaml"
    (tmp_path / "src").mkdir()
    plan = jobs.plan_submission(spec, SPEC + "code: src\n", now=T0)
    assert plan.code_dir == (tmp_path / "src").resolve() and plan.job_id.startswith("demo-1122-113000-")
    assert plan.doc["id"] == plan.job_id
    gcp = jobs.plan_submission(spec, SPEC + "cloud: gcp\ncode: src\n", now=T0)  # a gs:// bucket's job
    assert gcp.code_dir == plan.code_dir
    with pytest.raises(jobs.JobError, match="num_nodes"):
        jobs.plan_submission(spec, SPEC.replace("num_nodes: 2", "num_nodes: 0"))
    with pytest.raises(jobs.JobError, match="is not a directory"):
        jobs.plan_submission(spec, SPEC + "code: nowhere\n")


def test_a_spec_problem_names_its_field_and_the_file(tmp_path) -> None:
    spec = tmp_path / "job.yaml"
    with pytest.raises(jobs.SpecInvalid) as bad:
        jobs.plan_submission(spec, SPEC.replace("num_nodes: 2", "num_nodes: 0") + "code: nowhere\n")
    assert bad.value.source == str(spec) and str(bad.value).startswith(f"{spec}: code: 'nowhere' is not a directory")
    with pytest.raises(jobs.SpecInvalid) as bad:
        jobs.plan_submission(spec, SPEC.replace("num_nodes: 2", "num_nodes: 0"))
    assert [e.path for e in bad.value.errors] == ["num_nodes"]
    assert jobs.plan_submission(spec, SPEC).drawn and not jobs.plan_submission(spec, SPEC, job_id="given").drawn
    assert not jobs.plan_submission(spec, SPEC + "id: in-spec\n").drawn


# ---- artifacts ------------------------------------------------------------------------------------------------
def test_artifacts_are_what_the_manifests_name_and_download_where_their_paths_say(reg: Registry, tmp_path) -> None:
    publish(reg, "made", "model", {"result.json": b"{}", "weights/w.npz": b"123"})
    publish(reg, "made", "rank-1/output", {"log.txt": b"rank 1"})
    half = f"{keys.artifacts_prefix(data_of(reg, 'made'))}output/half-uploaded.bin"
    reg.put(half, b"x")  # no manifest yet: not an artifact
    found = jobs.artifacts(reg, data_of(reg, "made"))
    assert [(a.path, a.size) for a in found] == [("model/result.json", 2), ("model/weights/w.npz", 3),
                                                 ("rank-1/output/log.txt", 6)]
    assert found[0].written_at == WRITTEN
    written = jobs.download(reg, found, tmp_path / "out")
    assert [p.relative_to(tmp_path / "out").as_posix() for p in written] == [a.path for a in found]
    assert (tmp_path / "out" / "model" / "weights" / "w.npz").read_bytes() == b"123"


def test_an_artifact_path_out_of_the_destination_is_refused_before_any_download(reg: Registry, tmp_path) -> None:
    publish(reg, "hostile", "model", {"ok.txt": b"fine", "../../../escape.txt": b"gotcha"})
    with pytest.raises(jobs.JobError, match="outside"):
        jobs.download(reg, jobs.artifacts(reg, data_of(reg, "hostile")), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.rglob("escape.txt"))


def test_an_artifact_replaced_after_its_manifest_was_read_is_not_downloaded(reg: Registry, tmp_path) -> None:
    publish(reg, "moving", "model", {"a.txt": b"first"})
    found = jobs.artifacts(reg, data_of(reg, "moving"))
    reg.put(f"{keys.artifacts_prefix(data_of(reg, 'moving'))}model/a.txt", b"second")
    with pytest.raises(jobs.JobError, match="replaced or deleted"):
        jobs.download(reg, found, tmp_path)
