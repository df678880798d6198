"""The job commands end to end through click, on both clouds: a registry in moto's S3 (in-process) with EC2, and
one on the GCS fake with the Compute Engine fake (loopback servers, the real google-cloud clients), named by
s3:// and gs:// URLs (tests/registry_clouds.py). Queued jobs are jobs for describe / ls / logs, `logs -f` and
`submit -f` exit with the job's outcome, `wait` stops at its goal or its timeout, `cancel --force` ends the job's
VMs, `submit --code` uploads to the registry's own bucket. A driver thread plays the launcher, agents and sweeper
by writing what they write; it moves the job on conditions it reads (never on time), so every interleaving with
the CLI's polls ends the same."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from jobplane.cli.follow import EXIT_INTERRUPTED, EXIT_WAIT_TIMED_OUT, StatusLine, exit_code, tagged
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.model import keys
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.ops import jobs
from jobplane.sdk.job import _lines
from jobplane.store.registry import Registry
from jobplane.views.jobview import JobView, Status
from tests.cli.helpers import run
from tests.helpers import data_of, in_line
from tests.registry_clouds import BUCKET, GCP_ENV, SPEC, Driver, RegistryCloud, drop

pytestmark = pytest.mark.timeout(120)


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


def test_submit_follow_submits_then_follows_to_the_end(
        registry_cloud: RegistryCloud, reg: Registry, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(registry_cloud.spec("id: sub-follow\n"))
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


@pytest.fixture(params=["aws", "gcp"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], Callable[[str, bytes], None],
                                                            Callable[[], list[str]]]]:
    """A registry another process can reach (moto's server, or the GCS fake): (its env, put, keys)."""
    if request.param == "aws":
        endpoint = request.getfixturevalue("moto_endpoint")
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
        s3.create_bucket(Bucket=BUCKET)
        yield ({"AWS_ENDPOINT_URL": endpoint, "JOBPLANE_BUCKET": BUCKET, "AWS_REGION": "us-east-1"},
               lambda key, body: s3.put_object(Bucket=BUCKET, Key=key, Body=body),
               lambda: [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]])
        return
    from google.cloud import storage

    with FakeGcsServer() as gcs:
        gcs.create_bucket(BUCKET)
        env = {"JOBPLANE_BUCKET": BUCKET, "JOBPLANE_CLOUD": "gcp", "STORAGE_EMULATOR_HOST": gcs.endpoint, **GCP_ENV}
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.endpoint  # for this process's client, just below
        try:
            bucket = storage.Client(project="jobplane-cli").bucket(BUCKET)
        finally:
            del os.environ["STORAGE_EMULATOR_HOST"]
        yield (env, lambda key, body: bucket.blob(key).upload_from_string(body),
               lambda: [b.name for b in bucket.list_blobs()])


def _sigint_as_from_a_shell() -> None:
    """Ctrl-C reaches a command started from a shell with SIGINT's default action: whatever this test process
    ignores or blocks (a disposition or mask that a fork inherits), the CLI under test gets the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_masks(pid: int) -> str:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return ", ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


@pytest.mark.timeout(120)
def test_ctrl_c_stops_following_never_the_job(served: tuple[dict[str, str], Callable[[str, bytes], None],
                                                            Callable[[], list[str]]]) -> None:
    """A real SIGINT to a real `jobplane logs -f` (against moto's server or the GCS fake): exit 130, the job
    untouched."""
    env, put, listed = served
    put(keys.queue_entry("kept"), SPEC.encode())
    proc = subprocess.Popen([sys.executable, "-m", "jobplane.cli", "logs", "kept", "-f", "--interval", "0.2"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_as_from_a_shell)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # blocks until the follower has looked once
        assert first.startswith("status: queued "), first
        masks = _signal_masks(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            _, rest = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGINT did not end `logs -f` in 60 s; its signal masks then: {masks}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "stopped following kept; the job goes on (`jobplane cancel kept` stops it)" in rest
    assert "Traceback" not in rest
    assert listed() == ["queue/kept.yaml"]


def test_logs_of_a_rerun_job_tag_every_attempts_lines(reg: Registry) -> None:
    reg.create_job("rerun", parse_spec(SPEC, job_id="rerun"))
    for state, attempt in ((State.LAUNCHING, 1), (State.RUNNING, 1), (State.PREEMPTED, 1), (State.LAUNCHING, 2),
                           (State.RUNNING, 2)):
        reg.transition("rerun", state, attempt=attempt, instances=[f"i-{attempt}"])
    reg.store.put(keys.log_chunk(data_of(reg, "rerun"), 1, 0, 0), b"step 1\n")
    reg.store.put(keys.log_chunk(data_of(reg, "rerun"), 2, 0, 0), b"resuming from step 1\n")
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


# ---- the registry's own cloud -------------------------------------------------------------------------------
def test_submit_code_uploads_to_the_registrys_bucket_and_names_it_by_its_scheme(
        registry_cloud: RegistryCloud, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(registry_cloud.spec("id: with-code\n"))
    result = run("submit", str(spec), "--code", str(tmp_path / "src"))
    assert result.exit_code == 0, result.output
    scheme = "gs" if registry_cloud.name == "gcp" else "s3"
    uploaded = keys.code_upload(keys.DEFAULT_OWNER, "with-code")
    uri = f"{scheme}://{BUCKET}/{uploaded}"
    assert result.stdout == "with-code\n" and f"code: 1 files from {tmp_path / 'src'} -> {uri}" in result.stderr
    drop = parse_spec(registry_cloud.reg.get_bytes(keys.queue_entry("with-code")), job_id="with-code")
    assert drop.code == uri
    with tarfile.open(fileobj=io.BytesIO(registry_cloud.reg.get_bytes(uploaded))) as tar:
        assert tar.getnames() == ["train.py"]


def test_a_spec_for_the_other_cloud_is_refused_before_anything_is_uploaded(
        registry_cloud: RegistryCloud, tmp_path: Path) -> None:
    other = "aws" if registry_cloud.name == "gcp" else "gcp"
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + (f"cloud: {other}\n" if other == "gcp" else ""))
    (tmp_path / "src").mkdir()
    result = run("submit", str(spec), "--code", str(tmp_path / "src"))
    assert result.exit_code == 1
    assert f"Error: cloud: '{other}'" in result.stderr and "is not the cloud of the registry" in result.stderr
    assert list(registry_cloud.reg.listing("")) == []


def test_describe_shows_the_jobs_vms_and_cancel_force_ends_them(registry_cloud: RegistryCloud, reg: Registry) -> None:
    reg.create_job("forced", parse_spec(registry_cloud.spec(), job_id="forced"))
    vm = registry_cloud.start_vm("forced", 1)
    other = registry_cloud.start_vm("bystander", 1)
    reg.transition("forced", State.LAUNCHING, attempt=1, instances=[vm])
    reg.transition("forced", State.RUNNING)
    described = json.loads(run("describe", "forced", "--json").stdout)
    assert [i["id"] for i in described["instances"]] == [vm] and described["instances"][0]["state"] == "running"
    assert [e["kind"] for e in described["events"]] == ["created", "launching", "running"]
    assert "last_event" not in described["job"], "the record's copy of its last event is the registry's bookkeeping"
    assert vm in run("describe", "forced").stdout

    result = run("cancel", "forced", "--force")
    assert result.exit_code == 0, result.output
    assert result.stdout == "forced CANCELLED\n" and result.stderr == f"terminated {vm}\n"
    assert reg.job("forced").state == State.CANCELLED and reg.get_json(keys.stop_request("forced"))["by"] == "cli"
    assert registry_cloud.vms() == [other]


def test_ls_keeps_one_line_a_job_at_the_terminals_width(registry_cloud: RegistryCloud, reg: Registry,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 63: a waiting job's reason wrapped onto three lines; now cut short to the terminal's width (130
    columns here) or, piped, to 160 columns, and whole in describe."""
    from jobplane.cli import jobs as jobs_cli

    why = ("the deployment has 5 active instances; 1 more would exceed the quota of 5 (max_active_instances), "
           "and the family g5 has 4 of 4 in use; it waits for the next freed node in the deployment's order")
    for job_id in ("waits-a", "waits-b"):
        reg.create_job(job_id, parse_spec(registry_cloud.spec(), job_id=job_id))
        reg.transition(job_id, State.WAITING_CAPACITY, attempt=1, reason=why)
    assert jobs_cli.terminal_width() == 160  # not a terminal: CliRunner's stdout, as a pipe's
    piped = [line.rstrip() for line in run("ls").stdout.splitlines()]
    monkeypatch.setattr(jobs_cli, "terminal_width", lambda: 130)
    on_tty = [line.rstrip() for line in run("ls").stdout.splitlines()]
    for lines, width in ((piped, 160), (on_tty, 130)):
        assert lines and max(len(line) for line in lines) <= width and "ATTEMPT" in lines[0], lines
        assert [len([line for line in lines if j in line]) for j in ("waits-a", "waits-b")] == [1, 1], lines
        assert all(line.endswith("…") for line in lines if "waits-" in line), lines
    assert why in " ".join(run("describe", "waits-a").stdout.split())


def test_describe_reads_as_words_and_drops_what_no_longer_applies(registry_cloud: RegistryCloud, reg: Registry) -> None:
    """Issue 63: events were raw JSON folded at 80 columns; a job that never launched read `attempts 1 of at most
    4` beside a `launching attempt 1` event; an ended job still showed its last start and its end-by deadline."""
    reg.create_job("never", parse_spec(registry_cloud.spec(), job_id="never"))
    reg.transition("never", State.LAUNCHING, attempt=1, reason="launching attempt 1")
    reg.transition("never", State.CANCELLED, reason="cancelled while it waited")
    shown = run("describe", "never").stdout
    assert "attempts" not in shown and "last start" not in shown and "ends by" not in shown, shown
    lines = shown.splitlines()
    events = lines[lines.index("events (UTC)") + 1:]
    assert [line.split()[2] for line in events] == ["created", "launching", "cancelled"], shown
    assert events[1].endswith("QUEUED -> LAUNCHING; launching attempt 1 (no VM launched)"), events
    assert events[2].endswith("LAUNCHING -> CANCELLED; attempt 1; cancelled while it waited"), events

    reg.create_job("ran", parse_spec(registry_cloud.spec(), job_id="ran"))
    vm = registry_cloud.start_vm("ran", 1)
    reg.transition("ran", State.LAUNCHING, attempt=1, instances=[vm])
    reg.transition("ran", State.RUNNING)
    shown = run("describe", "ran").stdout
    assert "attempts  1 of at most" in shown and "last start" in shown and "ends by" in shown, shown
    assert "{" not in shown.split("events (UTC)")[1] and "['" not in shown, shown  # no JSON, no Python lists


def test_describe_shows_the_retries_used_and_the_jobs_lifetime_under_the_policy(
        registry_cloud: RegistryCloud, reg: Registry) -> None:
    reg.create_job("flaky", parse_spec(registry_cloud.spec("retry: {max: 2, on_exit_codes: [42]}\n"), job_id="flaky"))
    reg.transition("flaky", State.LAUNCHING, attempt=1)
    reg.transition("flaky", State.RUNNING)
    reg.transition("flaky", State.LAUNCHING, attempt=2, retries=1, reason="retry 1 of 2: exit code 42 (rank 0)")
    assert "retries  1 of 2" in run("describe", "flaky").stdout
    assert json.loads(run("describe", "flaky", "--json").stdout)["job"]["retries"] == 1
    # the policy lowered since the job was accepted: 1 + 3 restarts + 2 retries would be 6 attempts, 2d of max_wait
    reg.put(keys.POLICY, b"max_attempts_per_job: 3\nmax_wait_ceiling: 1d\ndefault_max_runtime: 2h\n", "text/yaml")
    created = reg.job("flaky").created_at
    shown = run("describe", "flaky").stdout
    assert "attempts  2 of at most 3 (policy max_attempts_per_job 3)" in shown, shown
    assert f"last start  {created + timedelta(days=1):%Y-%m-%d %H:%M} UTC (max_wait 1d)" in shown
    assert f"ends by  {created + timedelta(days=1, hours=2):%Y-%m-%d %H:%M} UTC (each attempt at most 2h)" in shown
    life = json.loads(run("describe", "flaky", "--json").stdout)["lifetime"]
    assert (life["attempts"], life["max_attempts"], life["max_attempts_per_job"], life["max_wait"],
            life["max_runtime"]) == (2, 3, 3, 86400, 7200)


def test_validate_needs_no_registry(registry_cloud: RegistryCloud, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(registry_cloud.spec())
    result = run("validate", str(spec))
    assert result.exit_code == 0 and result.stdout == f"{spec}: ok\n"


def test_a_bare_bucket_name_takes_its_cloud_from_cloud(
        registry_cloud: RegistryCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBPLANE_BUCKET")
    drop(registry_cloud.reg, "bare")
    listed = run("ls", "--json", "--bucket", BUCKET, "--cloud", registry_cloud.name)
    assert listed.exit_code == 0, listed.output
    assert [r["id"] for r in json.loads(listed.stdout)] == ["bare"]
    other = "aws" if registry_cloud.name == "gcp" else "gcp"
    wrong = run("ls", "--bucket", f"{'gs' if registry_cloud.name == 'gcp' else 's3'}://{BUCKET}", "--cloud", other)
    assert wrong.exit_code == 1 and f"is on {registry_cloud.name}, not {other}" in wrong.stderr


# ---- exit codes and the output's lines ----------------------------------------------------------------------------
def test_exit_codes_tell_endings_apart() -> None:
    assert exit_code(State.SUCCEEDED) == 0
    assert exit_code(State.RUNNING) == 0  # wait --for running
    endings = [State.FAILED, State.CANCELLED, State.TIMED_OUT, State.STALLED, State.INVALID]
    codes = [exit_code(s) for s in endings]
    assert 0 not in codes and len(set(codes)) == len(codes)
    assert EXIT_WAIT_TIMED_OUT not in codes and EXIT_INTERRUPTED not in codes


@pytest.mark.parametrize("text", ["", "\n", "a\n", "a", "a\nb", "a\n\n", "\n\nb\n", "a\rb\n", "a\r\n", "a\r",
                                  "10%\r20%\r30%\n", "x\x0cy\u2028z\n", "tail without newline"])
def test_log_lines_print_as_their_chunks_did(text: str) -> None:
    """The CLI prints the SDK's lines; what it prints is what printing each chunk printed: the chunk, with a line
    feed after one that lacks it, and tagged, each of its splitlines() prefixed."""
    lines = list(_lines(jobs.Chunk(2, 1, text)))
    newline = "\n" if text and not text.endswith("\n") else ""
    assert "".join(line + "\n" for line in lines) == text + newline
    old_tagged = "".join(f"[2/1] {part}" for part in text.splitlines(keepends=True)) + newline
    assert "".join(tagged(line) for line in lines) == old_tagged
    assert all((line.attempt, line.rank) == (2, 1) for line in lines)


@pytest.mark.parametrize("registry_cloud", ["gcp"], indirect=True)
def test_without_a_gcp_project_a_command_that_looks_at_vms_says_what_to_set(
        registry_cloud: RegistryCloud, reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    reg.create_job("vm", parse_spec(registry_cloud.spec(), job_id="vm"))
    reg.transition("vm", State.LAUNCHING, attempt=1, instances=["us-central1-a/vm-1"])
    result = run("describe", "vm")
    assert result.exit_code == 1
    assert result.stderr.strip() == ("Error: BackendError: on GCP set GOOGLE_CLOUD_PROJECT (or the policy's "
                                     "gcp.project) and JOBPLANE_REGION (or --region)")


# ---- where waiting jobs stand -------------------------------------------------------------------------------
def test_queue_and_describe_say_where_each_waiting_job_stands(registry_cloud: RegistryCloud) -> None:
    reg = registry_cloud.reg
    reg.put(keys.POLICY, b"max_active_instances_per_owner: 1\npriority_classes: {urgent: {value: 100}}\n")
    in_line(reg, [("running", registry_cloud.spec(), 0), ("plain", registry_cloud.spec(), 0),
                  ("rush", registry_cloud.spec("priority: urgent\n"), 100)], quota=1, now=datetime.now(UTC))
    rows = json.loads(run("queue", "--json").stdout)["jobs"]
    assert [(r["position"], r["id"], r["priority"], r["priority_class"], r["why"]) for r in rows] == [
        (1, "rush", 100, "urgent", "owner 'default' has 1 active instances; 1 more would exceed the quota of 1 "
                                   "(max_active_instances_per_owner)"),
        (2, "plain", 0, None, "1 earlier job of owner 'default' waits first (rush next, priority 100); 1 of 1 nodes in "
                              "use (max_active_instances_per_owner)")]
    table = run("queue", "--owner", "default")
    assert table.exit_code == 0 and "rush" in table.stdout and "owner 'default' has 1 active instances" in table.stdout
    assert run("queue", "--owner", "team-b").stderr == "no job waits for owner team-b\n"
    described = run("describe", "plain")
    assert ("position 2 of owner default's line; 1 earlier job of owner 'default' waits first (rush next, priority "
            "100); 1 of 1 nodes in use (max_active_instances_per_owner)") in " ".join(described.stdout.split())
