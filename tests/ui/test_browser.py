"""The dashboard in a real browser (Playwright driving Debian's headless Chromium, /usr/bin/chromium) against one
local cloud: a running job in the list, its log followed live, its loss chart, a preemption in its history, a
cancel from its page, a job whose name, output and metric name are `<script>` shown as text, and a sweep's page
with its trials and a scatter per parameter.

Screenshots of the jobs, a job's, the cost and the sweep page go to build/ui-screenshots/. One cloud, three short
jobs and a sweep of three short trials.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobplane.local.cloud import free_port
from jobplane.local.demo import CloudProcess
from jobplane.local.waiting import wait_for
from tests.local.conftest import cli_ok, paced, running, submit, write_spec
from tests.warm import Warm

pytest.importorskip("starlette", reason="the ui extra is not installed (pip install -e '.[ui]')")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(180)]
CHROMIUM = Path(os.environ.get("JOBPLANE_CHROMIUM", "/usr/bin/chromium"))
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "build" / "ui-screenshots"
EVIL = "<script>alert(1)</script>"
EVIL_CODE = f"""\
import time
print({EVIL!r} + " value 1.5", flush=True)
time.sleep(1)
"""
# A trial whose final loss is a known function of its lr (least at 1e-2) and warmup, printed as train.py prints.
SWEEP_CODE = """\
import math, os, time
lr, warmup = float(os.environ["SM_HP_LR"]), int(os.environ["SM_HP_WARMUP"])
final = 0.05 + (math.log10(lr) + 2) ** 2 + warmup / 1000
for step in range(1, 6):
    print(f"step {step * 10} loss {final + 1 / step:.4f}", flush=True)
    time.sleep(0.2)
print(f"step 60 loss {final:.4f}", flush=True)
"""
SWEEP = """\
sweep:
  parameters:
    lr: {loguniform: [0.0001, 1.0]}
    warmup: {int: [0, 500]}
  strategy: random
  max_trials: 3
  max_parallel: 3
  objective: {metric: loss, goal: minimize}
  seed: 11
"""


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Iterator[CloudProcess]:
    """This module's local AWS cloud, as each of tests/local/'s modules has its own."""
    yield from running(tmp_path_factory, "aws", warm)


@pytest.fixture(scope="module")
def ui(cloud: CloudProcess, warm: Warm) -> Iterator[str]:
    """`jobplane ui` on loopback over the local cloud's registry, as a user in a second shell starts it (forked warm:
    the CLI's imports paid once, tests/warm.py)."""
    port = free_port()
    log = cloud.state_dir / "ui.log"
    with log.open("ab") as out:
        proc = warm.popen([sys.executable, "-m", "jobplane.cli", "ui", "--port", str(port)], env=cloud.env,
                          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url + "/", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_for("the dashboard", answers, 30, 0.2,
                 abort=lambda: None if proc.poll() is None else f"jobplane ui exited {proc.returncode}: "
                                                                 f"{log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `make test` installs Debian's (apt-get install chromium) as root")
    with playwright.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"])
        except Exception as exc:  # a Chromium Playwright cannot drive
            pytest.skip(f"Playwright could not start {CHROMIUM}: {str(exc).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    """One context (a window) for the module, held open by a blank page: Chromium builds a window's own UI again
    for each new one, about 0.7 CPU s, so a context (or its last page closed) per test cost the module 5 or so."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.new_page()
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    """A page of each test's own, its errors and dialogs its own."""
    pg = context.new_page()
    pg.set_default_timeout(45_000)  # a loaded 2-core machine (the whole suite) is slow to answer
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("dialog", lambda dialog: dialog.accept())  # a <script> that ran would alert; a cancel confirms
    yield pg
    pg.close()
    assert not errors, f"the page's scripts failed: {errors}"


@pytest.fixture(scope="module")
def jobs(cloud: CloudProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The three jobs, submitted at once so they boot together: a Spot training run to follow and preempt, a
    sleeper to cancel, and the `<script>` one."""
    tmp = tmp_path_factory.mktemp("ui-jobs")
    evil_code = tmp / "evil"
    evil_code.mkdir()
    (evil_code / "evil.py").write_text(EVIL_CODE)
    evil = write_spec(tmp, "evil", "python3 evil.py", metrics=json.dumps([{"name": EVIL, "regex": r"value ([0-9.]+)"}]))
    evil.write_text(evil.read_text().replace("name: evil", f"name: {json.dumps(EVIL)}", 1))
    # a minute of training: still running when the preemption test's turn comes after the slow pages of a loaded
    # machine (at 30 s it had once finished by then); attempt 2 goes at a fifth of the pace, still seconds long
    # for the page to show it running, and its end is awaited by the module's last test, after the others. A
    # checkpoint every 50 steps: the preemption's SIGTERM saves the step it stopped at, and each save is a sync of
    # the agent's to the cloud's S3 (every 10 was one each 0.3 s of attempt 2)
    train = write_spec(tmp, "train", paced("python3 train.py --steps 300 --checkpoint-every 50", 0.2, 0.04),
                       max_restarts="2", owner="vision", labels="{team: vision}")
    # silent: without a long stall_timeout the local policy's 60 s would end it STALLED (no cancel button) before
    # the cancel test's turn on a loaded machine
    sleeper = write_spec(tmp, "sleeper", "sleep 1500", spot="false", stall_timeout="25m", max_runtime="30m")
    sweep_code = tmp / "sweep"
    sweep_code.mkdir()
    (sweep_code / "trial.py").write_text(SWEEP_CODE)
    search = write_spec(tmp, "search", "python3 trial.py", spot="false")
    search.write_text(search.read_text() + SWEEP)
    return {"train": submit(cloud, train), "sleeper": submit(cloud, sleeper, evil_code),
            "evil": submit(cloud, evil, evil_code), "sweep": submit(cloud, search, sweep_code)}


@pytest.fixture(scope="module")
def memory_ui() -> Iterator[str]:
    """The dashboard in this process (uvicorn on a loopback port of its own) over an in-memory registry of
    tests/ui/scenes.py's jobs: charts to read without a cloud."""
    import threading

    import uvicorn

    from jobplane.clouds.memory import MemoryCompute, MemoryStore
    from jobplane.store.registry import Registry
    from jobplane.ui.server import create_app
    from tests.ui import scenes
    from tests.ui.apps import over

    reg = Registry(MemoryStore(), "root")
    scenes.finished_with_files(reg)
    scenes.preempted_spot(reg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(over(reg, MemoryCompute)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the in-memory dashboard", lambda: server.started, 30, 0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_the_charts_tick_steps_at_whole_numbers_and_split_attempts(memory_ui: str, page: Any) -> None:
    """The loss's step axis ticks at whole steps; a network of a few KB/s reads in KB/s with distinct ticks; each
    attempt of a preempted job is its own line (the second dashed in the same colour)."""
    page.goto(memory_ui + "/jobs/resnet-0412")
    loss = page.locator('.chart[data-metric="loss"]')
    playwright.expect(loss).to_have_attribute("data-xticks", re.compile(r"."), timeout=20_000)
    steps = loss.get_attribute("data-xticks").split("|")
    assert steps and all(re.fullmatch(r"\d+", t) for t in steps if t), steps
    page.goto(memory_ui + "/jobs/spot-llm")
    network = page.locator('.chart[data-metric="Network (KB/s)"]')
    playwright.expect(network).to_have_attribute("data-yticks", re.compile(r"."), timeout=20_000)
    ticks = [t for t in network.get_attribute("data-yticks").split("|") if t]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks) and "0" not in ticks[1:], ticks  # no "0, 0, 0"
    cpu = page.locator('.chart[data-metric="CPU (%)"]')
    assert cpu.get_attribute("data-lines") == "2" and network.get_attribute("data-lines") == "4"
    legend = page.locator('.chart[data-metric="CPU (%)"] .u-legend .u-series .u-label')
    playwright.expect(legend).to_have_text(["time", "cpu_percent · attempt 1", "cpu_percent · attempt 2"])
    shot(page, "system")


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_the_jobs_page_shows_a_running_job_live(ui: str, jobs: dict[str, str], page: Any) -> None:
    page.goto(ui + "/")
    row = page.locator(f'tr[data-job="{jobs["train"]}"]')
    # no reload: htmx polls the table, so the job moves from QUEUED/LAUNCHING to RUNNING on the open page
    playwright.expect(row.locator(".badge")).to_have_text("RUNNING", timeout=90_000)
    playwright.expect(page.locator('.count[data-state="RUNNING"] b')).not_to_have_text("0")
    page.select_option("select[name=owner]", "vision")
    playwright.expect(page.locator(f'tr[data-job="{jobs["sleeper"]}"]')).to_have_count(0)
    playwright.expect(row).to_have_count(1)
    page.select_option("select[name=owner]", "")
    playwright.expect(page.locator(f'tr[data-job="{jobs["sleeper"]}"]')).to_have_count(1)
    shot(page, "jobs")


def test_a_job_page_follows_its_log_and_charts_its_loss(ui: str, cloud: CloudProcess, jobs: dict[str, str],
                                                        page: Any) -> None:
    job = jobs["train"]
    page.goto(f"{ui}/jobs/{job}")
    log = page.locator("#log")
    playwright.expect(log).to_contain_text("step 10 loss", timeout=60_000)
    first = log.inner_text()
    # the line after the newest one shown (train.py prints every 10th step): it comes while the page is open. A
    # fixed step could already be on the first render when the page loads late on a loaded machine.
    newest = max(int(n) for n in re.findall(r"^step (\d+) loss", first, re.M))
    playwright.expect(log).to_contain_text(f"step {(newest // 10 + 1) * 10} loss", timeout=60_000)
    assert len(log.inner_text()) > len(first)
    chart = page.locator('.chart[data-metric="loss"]')
    playwright.expect(chart.locator("canvas")).to_have_count(1, timeout=30_000)
    shot(page, "job")


@pytest.mark.timeout(360)  # a preemption and a second boot, on a loaded machine
def test_a_preemption_shows_in_the_history_then_attempt_2(ui: str, cloud: CloudProcess,
                                                          jobs: dict[str, str], page: Any) -> None:
    """The preemption and attempt 2 running, live on the open page; the run's end and its chart are the module's
    last test (test_the_preempted_job_ends_with_both_attempts_on_its_chart), so the tests between overlap the
    rest of attempt 2."""
    job = jobs["train"]
    page.goto(f"{ui}/jobs/{job}")
    assert json.loads(cli_ok(cloud, "describe", job, "--json"))["job"]["state"] == "RUNNING", "nothing to preempt"
    cli_ok(cloud, "local", "preempt", job, "--grace", "10")
    timeline = page.locator("#timeline")
    playwright.expect(timeline.locator('li[data-state="PREEMPTED"]')).to_have_count(1, timeout=60_000)
    playwright.expect(page.locator('table.attempts tr[data-attempt="2"]')).to_have_count(1, timeout=60_000)
    playwright.expect(timeline.locator("li").last).to_have_attribute("data-state", "RUNNING", timeout=60_000)
    playwright.expect(page.locator("select[name=attempt]")).to_have_value("2")  # the log follows attempt 2
    playwright.expect(page.locator("#log")).to_contain_text("resuming from step", timeout=60_000)


def test_cancel_from_the_page_ends_the_job_cancelled(ui: str, cloud: CloudProcess, jobs: dict[str, str],
                                                     page: Any) -> None:
    job = jobs["sleeper"]
    page.goto(f"{ui}/jobs/{job}")
    page.click("#cancel")  # confirmed by the dialog handler
    playwright.expect(page.locator("#state")).to_have_text("CANCELLED", timeout=30_000)
    playwright.expect(page.locator("#cancel")).to_have_count(0)


def test_a_script_in_a_name_a_log_and_a_metric_is_shown_as_text(ui: str, jobs: dict[str, str], page: Any) -> None:
    job = jobs["evil"]
    page.goto(f"{ui}/jobs/{job}")
    playwright.expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=90_000)
    page.reload()
    playwright.expect(page.locator("h1 .name")).to_have_text(EVIL)
    playwright.expect(page.locator("#log")).to_contain_text(EVIL + " value 1.5", timeout=20_000)
    playwright.expect(page.locator(f'.chart[data-metric="{EVIL}"] h3')).to_have_text(EVIL)
    assert page.evaluate("document.querySelectorAll('script:not([src]):not([type])').length") == 0
    page.goto(f"{ui}/?all=1")
    playwright.expect(page.locator(f'tr[data-job="{job}"] .name')).to_have_text(EVIL)


def test_the_cost_page_charts_cost_by_owner(ui: str, jobs: dict[str, str], page: Any) -> None:
    page.goto(f"{ui}/cost?by=owner&period=24h")
    playwright.expect(page.locator("table.cost tbody tr")).not_to_have_count(0)
    playwright.expect(page.locator("#cost-chart .bar .label", has_text="vision")).to_have_count(1)
    shot(page, "cost")
    page.goto(f"{ui}/compare?id={jobs['train']}&id={jobs['evil']}&metric=loss")
    playwright.expect(page.locator("#compare canvas")).to_have_count(1)


def test_a_sweep_page_charts_each_parameter_against_the_objective(ui: str, jobs: dict[str, str], page: Any) -> None:
    sweep = jobs["sweep"]

    def recorded() -> bool:  # the launcher records the sweep from its drop
        try:
            with urllib.request.urlopen(f"{ui}/sweeps/{sweep}", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for("the sweep's record", recorded, 90, 0.5)
    page.goto(f"{ui}/sweeps/{sweep}")
    # no reload: the page follows a live sweep until its three trials have ended and the sweeper named the best
    playwright.expect(page.locator("#state")).to_have_text("COMPLETED", timeout=150_000)
    playwright.expect(page.locator("table.trials tbody tr")).to_have_count(3)
    for parameter in ("lr", "warmup"):
        chart = page.locator(f'figure.scatter[data-parameter="{parameter}"]')
        playwright.expect(chart.locator("circle.dot")).to_have_count(3)
        playwright.expect(chart.locator("circle.dot.best")).to_have_count(1)
    playwright.expect(page.locator('figure.scatter[data-parameter="lr"]')).to_have_attribute("data-log-x", "1")
    best = page.locator("table.trials tbody tr").first
    playwright.expect(best).to_have_class("best")
    playwright.expect(best.locator(".badge")).to_have_text("SUCCEEDED")
    shot(page, "sweep")
    page.goto(f"{ui}/sweeps?all=1")
    playwright.expect(page.locator(f'tr[data-sweep="{sweep}"] .badge')).to_have_text("COMPLETED")


@pytest.mark.timeout(360)  # the rest of attempt 2, on a loaded machine
def test_the_preempted_job_ends_with_both_attempts_on_its_chart(ui: str, cloud: CloudProcess,
                                                               jobs: dict[str, str], page: Any) -> None:
    """The preemption test's job (attempt 2 running when that test ended) followed to SUCCEEDED on its page, then
    its chart holds every point of both attempts."""
    job = jobs["train"]
    page.goto(f"{ui}/jobs/{job}")
    playwright.expect(page.locator('table.attempts tr[data-attempt="2"]')).to_have_count(1)
    playwright.expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=180_000)
    page.reload()  # the finished job's chart, every point in
    loss = next(m for m in json.loads(cli_ok(cloud, "metrics", job, "--json"))["metrics"] if m["name"] == "loss")
    chart = page.locator('.chart[data-metric="loss"]')
    playwright.expect(chart).to_have_attribute("data-points", str(loss["count"]))
    # one point per (attempt, step) on the chart: a step printed twice (train.py's last line repeats its last
    # step's loss) shows its last value
    distinct = {(attempt, step) for attempt, step, _, _ in loss["points"]}
    playwright.expect(chart).to_have_attribute("data-plotted", str(len(distinct)))
    assert loss["attempts"] == [1, 2]
    page.check("#logscale")
    playwright.expect(page.locator('.chart[data-metric="loss"] canvas')).to_have_count(1)
    shot(page, "job-preempted")
