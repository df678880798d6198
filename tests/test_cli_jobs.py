"""The job commands end to end through click, over a registry in moto's S3 (in-process): queued jobs are
jobs for describe / ls / logs, `logs -f` and `submit -f` exit with the job's outcome, `wait` stops at its goal
or its timeout. A driver thread plays the launcher, agents and sweeper by writing what they write; it moves
the job on conditions it reads (never on time), so every interleaving with the CLI's polls ends the same."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner, Result
from moto import mock_aws

from jobplane import jobs, keys
from jobplane.cli import StatusLine, cli
from jobplane.clouds.s3 import S3Store
from jobplane.jobview import JobView, Status
from jobplane.registry import Registry
from jobplane.spec import parse_spec
from jobplane.states import State
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)
BUCKET = "jobplane-cli"
SPEC = "name: demo\ninstance_type: t3.micro\nspot: true\nrun: python3 train.py\n"


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setenv("JOBPLANE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield Registry(S3Store(BUCKET, s3))


@pytest.fixture
def first_status(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a follow has computed its first status line (so a driver can wait for the CLI to look)."""
    shown = threading.Event()
    original = jobs.status

    def status(view: JobView, now: datetime) -> Status:
        try:
            return original(view, now)
        finally:
            shown.set()

    monkeypatch.setattr(jobs, "status", status)
    return shown


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def drop(reg: Registry, job_id: str, text: str = SPEC) -> None:
    reg.store.put(keys.queue_entry(job_id), text.encode(), "application/yaml")


class Driver(threading.Thread):
    """Takes the job from queue/ once it is there, runs it with some output, and ends it as told."""

    def __init__(self, reg: Registry, job_id: str, ending: State | None, after: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.reg, self.job_id, self.ending = reg, job_id, ending
        self.after = after or threading.Event()
        if after is None:
            self.after.set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            job_id = self.job_id
            wait_for(f"{job_id} in queue/", lambda: any(True for _ in self.reg.listing(keys.queue_entry(job_id))), 60)
            wait_for("the CLI to show a first status", self.after.is_set, 60)
            reg = self.reg
            reg.create_job(job_id, parse_spec(reg.get_bytes(keys.queue_entry(job_id)), job_id=job_id))
            reg.transition(job_id, State.LAUNCHING, expect={State.QUEUED}, attempt=1, instances=["i-0abc"])
            reg.delete(keys.queue_entry(job_id))
            reg.transition(job_id, State.RUNNING)
            reg.store.put(keys.log_chunk(job_id, 1, 0, 0), b"step 1 loss 0.5\n")
            if self.ending is None:
                return
            reg.store.put(keys.log_chunk(job_id, 1, 0, 1), b"step 2 loss 0.1\n")
            reg.put_json(keys.exit_report(job_id, 1, 0), {"code": 0 if self.ending == State.SUCCEEDED else 1})
            reg.transition(job_id, self.ending, reason="every rank exited" if self.ending == State.SUCCEEDED
                           else "rank 0 exited 1")
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(60)
        assert not self.is_alive(), "the driver did not finish in 60 s"
        assert self.error is None, repr(self.error)


# ---- a queued job is a job ----------------------------------------------------------------------------------
def test_describe_ls_and_logs_show_a_job_still_in_queue(reg: Registry) -> None:
    drop(reg, "waiting-1")
    described = run("describe", "waiting-1")
    assert described.exit_code == 0, described.output
    assert "QUEUED" in described.stdout and "queued " in described.stdout and "queue/waiting-1.yaml" in described.stdout
    assert "run: python3 train.py" in described.stdout

    body = json.loads(run("describe", "waiting-1", "--json").stdout)
    assert body["job"]["state"] == "QUEUED" and body["job"]["spec"]["instance_type"] == "t3.micro"
    assert body["job"]["waited"] >= 0 and body["events"] == [] and body["instances"] == []

    rows = json.loads(run("ls", "--json").stdout)
    assert [(r["id"], r["state"], r["instance_type"]) for r in rows] == [("waiting-1", "QUEUED", "t3.micro")]
    table = run("ls")
    assert "waiting-1" in table.stdout and "QUEUED" in table.stdout

    logs = run("logs", "waiting-1")
    assert logs.exit_code == 0 and logs.stdout == ""
    assert "job waiting-1: queued" in logs.stderr and "no output yet" in logs.stderr


def test_an_id_neither_queued_nor_recorded_is_one_clear_error(reg: Registry) -> None:
    for command in (["describe", "nope"], ["logs", "nope"], ["logs", "nope", "-f"], ["cancel", "nope"],
                    ["wait", "nope"]):
        result = run(*command)
        assert result.exit_code == 1, command
        assert result.stderr.strip() == "Error: no job 'nope'", command


# ---- following ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("ending", "code"), [(State.SUCCEEDED, 0), (State.FAILED, 1)])
def test_logs_follow_waits_for_a_queued_job_and_exits_with_its_outcome(reg: Registry, ending: State, code: int,
                                                                       first_status: threading.Event) -> None:
    drop(reg, "followed")
    driver = Driver(reg, "followed", ending, after=first_status)
    driver.start()
    result = run("logs", "followed", "-f", "--interval", "0.05")
    driver.finish()
    assert result.exit_code == code, result.output
    assert result.stdout == "step 1 loss 0.5\nstep 2 loss 0.1\n"
    assert result.stderr.startswith("status: queued "), result.stderr
    assert result.stderr.rstrip().endswith(f"job followed {ending}: " + ("every rank exited" if code == 0
                                                                         else "rank 0 exited 1"))


def test_submit_follow_submits_then_follows_to_the_end(reg: Registry, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "id: sub-follow\n")
    driver = Driver(reg, "sub-follow", State.SUCCEEDED)
    driver.start()
    result = run("submit", str(spec), "-f", "--interval", "0.05")
    driver.finish()
    assert result.exit_code == 0, result.output
    assert result.stdout == "sub-follow\nstep 1 loss 0.5\nstep 2 loss 0.1\n"
    assert reg.job("sub-follow").state == State.SUCCEEDED


def test_wait_for_running_then_for_terminal_with_a_timeout(reg: Registry) -> None:
    drop(reg, "waited")
    driver = Driver(reg, "waited", None)  # runs, never ends
    driver.start()
    up = run("wait", "waited", "--for", "running", "--interval", "0.05")
    driver.finish()
    assert up.exit_code == 0, up.output
    assert up.stderr.rstrip().endswith("job waited RUNNING")

    late = run("wait", "waited", "--for", "terminal", "--timeout", "1s", "--interval", "0.05")
    assert late.exit_code == 124, late.output
    assert "timed out after 1s waiting for waited to be terminal: it is RUNNING" in late.stderr
    assert reg.job("waited").state == State.RUNNING  # waiting never touches the job


def test_wait_exits_with_the_ending_of_a_finished_job(reg: Registry) -> None:
    drop(reg, "done")
    driver = Driver(reg, "done", State.FAILED)
    driver.start()
    driver.finish()
    assert run("wait", "done").exit_code == 1
    assert run("wait", "done", "--for", "running").exit_code == 1  # it ended without succeeding


def test_wait_rejects_a_bad_timeout(reg: Registry) -> None:
    result = run("wait", "x", "--timeout", "soon")
    assert result.exit_code == 2 and "invalid duration 'soon'" in result.stderr


# ---- cancelling ---------------------------------------------------------------------------------------------
def test_cancel_a_queued_job(reg: Registry) -> None:
    drop(reg, "unwanted")
    result = run("cancel", "unwanted")
    assert result.exit_code == 0, result.output
    assert result.stdout == "unwanted CANCELLED before launch\n"
    assert reg.job("unwanted").state == State.CANCELLED
    assert list(reg.listing(keys.QUEUE)) == []
    assert json.loads(run("ls", "--all", "--json").stdout)[0]["state"] == "CANCELLED"
    again = run("cancel", "unwanted")
    assert again.exit_code == 1 and again.stderr.strip() == "Error: job unwanted is already CANCELLED"


@pytest.mark.timeout(120)
def test_ctrl_c_stops_following_never_the_job(moto_endpoint: str) -> None:
    """A real SIGINT to a real `jobplane logs -f` (against the moto server): exit 130, the job untouched."""
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_endpoint, "JOBPLANE_BUCKET": BUCKET, "AWS_REGION": "us-east-1"}
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=keys.queue_entry("kept"), Body=SPEC.encode())
    proc = subprocess.Popen([sys.executable, "-m", "jobplane.cli", "logs", "kept", "-f", "--interval", "0.2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # blocks until the follower has looked once
        assert first.startswith("status: queued "), first
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "stopped following kept; the job goes on (`jobplane cancel kept` stops it)" in rest
    assert "Traceback" not in rest
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]] == ["queue/kept.yaml"]


def test_logs_of_a_rerun_job_tag_every_attempts_lines(reg: Registry) -> None:
    reg.create_job("rerun", parse_spec(SPEC, job_id="rerun"))
    for state, attempt in ((State.LAUNCHING, 1), (State.RUNNING, 1), (State.PREEMPTED, 1), (State.LAUNCHING, 2),
                           (State.RUNNING, 2)):
        reg.transition("rerun", state, attempt=attempt, instances=[f"i-{attempt}"])
    reg.store.put(keys.log_chunk("rerun", 1, 0, 0), b"step 1\n")
    reg.store.put(keys.log_chunk("rerun", 2, 0, 0), b"resuming from step 1\n")
    reg.put_json(keys.exit_report("rerun", 2, 0), {"code": 0})
    reg.transition("rerun", State.SUCCEEDED, reason="every rank exited 0")
    for command in (["logs", "rerun"], ["logs", "rerun", "-f"]):
        result = run(*command)
        assert result.exit_code == 0 and result.stdout == "[1/0] step 1\n[2/0] resuming from step 1\n", command
    assert run("logs", "rerun", "--attempt", "2").stdout == "resuming from step 1\n"


def test_on_a_terminal_the_status_line_is_rewritten_in_place_below_the_output(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "31")
    line = StatusLine()
    line.show(Status("queued", "queued 1s: waiting for the launcher"))
    line.show(Status("queued", "queued 2s: waiting for the launcher"))
    line.above("step 1\n")
    line.end()
    clear = "\r\x1b[K"
    shown = "queued 2s: waiting for the lau"  # cut to the terminal's width, so clearing clears it all
    assert err.getvalue() == f"{clear}queued 1s: waiting for the lau{clear}{shown}{clear}{shown}{clear}"
    assert capsys.readouterr().out == "step 1\n"
