"""`make demo` (`make demo CLOUD=gcp`): the whole lifecycle on one machine, on the local AWS or GCP cloud,
checked. Exit 0 only if every check passes.

Starts `jobplane local up --cloud CLOUD` as its own process, submits examples/demo.yaml (examples/gcp/ on
GCP) with examples/train as code and follows it (`submit -f`), prints `jobplane ls --all` and `jobplane
metrics` (the loss its agent read from the output), then checks: the job SUCCEEDED, its loss fell, logs and
checkpoints are in the bucket, its cost was estimated, its end was published on the notification topic, no VM
is left running. Then two jobs side by side: demo-spot.yaml is preempted mid-run and must resume from its
synced checkpoint on attempt 2 and succeed; demo-runaway.yaml must be asked to stop by its uptime cap and end
TIMED_OUT. On GCP, before these, GCE's own uptime cap: with the uptime-cap function paused,
demo-max-run-duration.yaml runs into its VM's maxRunDuration, whose shutdown-script stops the agent, and ends
TIMED_OUT all the same. Last, after the
local cloud stops, no process or port may remain.

Every step waits on a condition with a deadline meant for a loaded 2-core machine, and a failed check
says what it waited for and what it saw.

    python -m jobplane.local.demo [--cloud aws|gcp] [--state-dir DIR] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobplane.agent.process import marked_pids
from jobplane.clouds.base import Instance
from jobplane.local import environment_over
from jobplane.local.control import STATE_FILE
from jobplane.local.dashboard import ui_url
from jobplane.local.waiting import WaitTimeout, wait_for
from jobplane.model import keys
from jobplane.ops import backend
from jobplane.settings import Settings

REPO = Path(__file__).resolve().parents[3]
# The specs each cloud's demo submits (examples/train is their code).
SPECS = {
    "aws": {"happy": "examples/demo.yaml", "spot": "examples/demo-spot.yaml", "runaway": "examples/demo-runaway.yaml"},
    "gcp": {"happy": "examples/gcp/demo.yaml", "spot": "examples/gcp/demo-spot.yaml",
            "runaway": "examples/gcp/demo-runaway.yaml", "max_run": "examples/gcp/demo-max-run-duration.yaml"},
}
# What each cloud's console must have said by the demo's end: every lifecycle step.
CONSOLE_VERBS = {
    "aws": {"launched", "booted", "running", "preempted", "rerun", "capped", "finished", "terminated"},
    "gcp": {"launched", "booted", "running", "preempted", "rerun", "capped", "finished", "deleted"},
}
# Where a local cloud's APIs are: no process may answer there once it has stopped.
ENDPOINTS = ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "JOBPLANE_COMPUTE_ENDPOINT")


class Spawned(Protocol):
    """What CloudProcess asks of its `local up` process: Popen's part."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class CloudProcess:
    """`jobplane local up` in a child process: what a user runs in their first shell (tests use it too)."""

    def __init__(self, state_dir: Path, tick: float = 1.0, cloud: str = "aws", ui: bool = False, port: int = 0,
                 policy: Path | None = None, baked_agent: bool = False, faults: tuple[float, int] | None = None
                 ) -> None:
        self.state_dir = state_dir
        self.faults = faults  # `local up --faults RATE --faults-seed N`
        self.baked_agent = baked_agent  # `local up --baked-agent`: the VMs' images hold the agent
        self.ui = ui  # the dashboard beside it (`local up --ui-port 0`); tests start their own when they want one
        self.port = port  # the cloud's API (`local up --port`): any free one unless a test asks for a busy one
        self.policy = policy  # `local up --policy`
        self.tick = tick
        self.cloud = cloud
        self.proc: Spawned | None = None
        self.state: dict[str, Any] = {}

    def start(self, timeout: float = 60) -> CloudProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ENDPOINTS}
        with (self.state_dir / "local-cloud.log").open("ab") as out:
            self.proc = self.spawn(
                [sys.executable, "-m", "jobplane.cli", "local", "up", "--cloud", self.cloud, "--port", str(self.port),
                 "--tick", str(self.tick), "--state-dir", str(self.state_dir), "--ui-port", "0" if self.ui else "-1",
                 *(["--policy", str(self.policy)] if self.policy else []),
                 *(["--baked-agent"] if self.baked_agent else []),
                 *(["--faults", str(self.faults[0]), "--faults-seed", str(self.faults[1])] if self.faults else [])],
                stdout=out, stderr=subprocess.STDOUT,
                env=env, stdin=subprocess.DEVNULL)
        proc, log = self.proc, self.state_dir / "local-cloud.log"
        try:
            wait_for(f"the local cloud's {STATE_FILE}", (self.state_dir / STATE_FILE).exists, timeout,
                     abort=lambda: None if proc.poll() is None else f"local up exited {proc.returncode}")
        except WaitTimeout as exc:
            self.stop()
            raise RuntimeError(f"the local cloud did not start ({exc}); see {log}") from None
        self.state = json.loads((self.state_dir / STATE_FILE).read_text())
        return self

    def spawn(self, argv: list[str], **popen: Any) -> Spawned:
        """The `local up` process (a test's may come forked from a warm interpreter: tests/warm.py)."""
        return subprocess.Popen(argv, **popen)

    @property
    def exported(self) -> dict[str, str]:
        """What `source .jobplane/env.sh` sets in a second shell."""
        return {k: str(v) for k, v in self.state.items() if k.isupper()}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.exported, "JOBPLANE_LOCAL_STATE": str(self.state_dir)}

    @property
    def settings(self) -> Settings:
        region = self.state.get("JOBPLANE_REGION") or self.state.get("AWS_REGION")
        return Settings.from_env(self.state["JOBPLANE_BUCKET"], region=region)

    def environment(self) -> contextlib.AbstractContextManager[None]:
        """The exports, while a client is made (clients read their endpoints when they are made)."""
        return environment_over(self.exported)

    def cli(self, *args: str, timeout: float = 60, echo: bool = False) -> subprocess.CompletedProcess[str]:
        """Run `jobplane ARGS` as a user in the second shell would. With echo, the command and its output are
        shown as they come (stderr, where status lines go, straight through) and stdout is kept too."""
        cmd = [sys.executable, "-m", "jobplane.cli", *args]
        if not echo:
            return subprocess.run(cmd, env=self.env, text=True, timeout=timeout, capture_output=True, cwd=REPO)
        print(f"$ jobplane {' '.join(args)}", flush=True)
        out: list[str] = []
        with subprocess.Popen(cmd, env=self.env, text=True, stdout=subprocess.PIPE, cwd=REPO) as proc:
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                for line in proc.stdout or ():
                    print(line, end="", flush=True)
                    out.append(line)
                code = proc.wait()
            finally:
                timer.cancel()
        if code == -signal.SIGKILL:
            raise subprocess.TimeoutExpired(cmd, timeout, "".join(out))
        return subprocess.CompletedProcess(cmd, code, "".join(out), None)

    def registry(self) -> Any:
        with self.environment():
            return backend.registry(self.settings)

    def vms(self) -> list[Instance]:
        """The managed VMs the cloud lists (every state but gone)."""
        with self.environment():
            compute = backend.compute(self.settings, self.registry())
        return compute.list_managed()

    def aws(self) -> Any:
        """The local AWS cloud's EC2, S3 and SSM, for what only AWS has (raw instances, user-data)."""
        from jobplane.clouds.aws_local import LocalAws

        return LocalAws(self.state["AWS_REGION"], self.state["AWS_ENDPOINT_URL"], self.state)

    def instances(self, managed_only: bool = True) -> list[Any]:
        return list(self.aws().instances(managed_only))

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, as Ctrl-C would; SIGKILL only if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def leftovers(self) -> list[str]:
        """Anything the local cloud started that is still alive: VM processes, emulators, their ports."""
        found = [f"instance process {pid}" for pid in marked_pids(f"JOBPLANE_LOCAL_CLOUD={self.state.get('cloud_id')}")]
        pids = {"local up": self.state.get("pid"), **(self.state.get("services") or {})}
        for name, pid in pids.items():
            if pid and Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid):
                found.append(f"{name} (pid {pid})")
        for name in ENDPOINTS:
            url = str(self.state.get(name, ""))
            if url:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) == 0:
                        found.append(f"port {url}")
        return found


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@dataclass
class Demo:
    cloud: CloudProcess
    timeout: float
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def specs(self) -> dict[str, str]:
        return SPECS[self.cloud.cloud]

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)
        return ok

    def submit(self, spec: str, code: str = "examples/train") -> str:
        done = self.cloud.cli("submit", spec, "--code", code)
        if done.returncode != 0:
            raise RuntimeError(f"submit failed: {done.stderr.strip()}")
        job_id = done.stdout.strip().splitlines()[-1]
        print(f"$ jobplane submit {spec} --code {code}\n{job_id}", flush=True)
        return job_id

    def follow(self, *command: str) -> tuple[int | None, str]:
        """`jobplane logs ID -f` or `submit ... -f`: the output of every attempt until the job ends; returns the
        exit code (None if the job did not end within the demo's timeout) and what it printed."""
        try:
            done = self.cloud.cli(*command, timeout=self.timeout, echo=True)
        except subprocess.TimeoutExpired as exc:
            self.check(f"{' '.join(command[:2])} ended in time", False, f"still following after {self.timeout:.0f}s")
            return None, str(exc.output or "")
        return done.returncode, done.stdout

    def run(self) -> None:
        """Every step of the demo, in order."""
        max_run = self.start_max_run_duration() if "max_run" in self.specs else None
        self.happy_path()
        if max_run:
            self.max_run_duration(max_run)
        runaway = self.submit(self.specs["runaway"])  # its uptime clock runs meanwhile
        self.preemption()
        self.uptime_cap(runaway)
        self.cloud.cli("ls", "--all", echo=True)
        self.no_instance_left()
        self.console()

    def console(self) -> None:
        """What the local cloud's console said meanwhile: every lifecycle step, and not one line of the functions'
        structured logs, which go to functions.log as they would to CloudWatch or Cloud Logging."""
        console = (self.cloud.state_dir / "local-cloud.log").read_text()
        verbs = {line.split()[1] for line in console.splitlines() if re.match(r"\d\d:\d\d:\d\d  ", line)}
        missing = sorted(CONSOLE_VERBS[self.cloud.cloud] - verbs)
        self.check("the console showed every step", not missing, f"never said: {', '.join(missing)}" if missing else "")
        leaked = [mark for mark in ('"_aws"', '"level"', '"severity"') if mark in console]
        self.check("no function log or metric on the console", not leaked, ", ".join(leaked))
        logged = (self.cloud.state_dir / "functions.log").read_text()
        if self.cloud.cloud == "aws":
            ok = '"_aws"' in logged and '"function_name":"jobplane-launcher"' in logged  # EMF metrics, Powertools
        else:
            entries = [json.loads(line) for line in logged.splitlines() if line.startswith('{"severity"')]
            ok = any(e.get("metric") == "CheckDuration" for e in entries) and any(
                said.get("result") == "launched" for e in entries for said in e.get("result", {}).get("outcomes", []))
        self.check("the functions' logs and metrics in functions.log", ok)

    def happy_path(self) -> None:
        code, out = self.follow("submit", self.specs["happy"], "--code", "examples/train", "-f")
        job_id = out.splitlines()[0] if out else ""
        if not job_id:
            self.check("submit -f printed the job id", False, f"exit code {code}, no output")
            return
        if url := ui_url(self.cloud.state_dir):
            print(f"the job's page on the dashboard: {url}/jobs/{job_id}", flush=True)
        self.cloud.cli("ls", "--all", echo=True)
        reg = self.cloud.registry()
        record = reg.job(job_id)
        self.check("job SUCCEEDED", record.state == "SUCCEEDED", f"{record.state} {record.reason or ''}".strip())
        self.check("submit -f exited 0 with it", code == 0, f"exit code {code}")
        logs = [k for k, _, _ in reg.listing(keys.logs_prefix(record.data))]
        self.check("logs in the bucket", bool(logs), f"{len(logs)} chunks under {keys.logs_prefix(record.data)}")
        ckpts = [k for k, _, _ in reg.listing(keys.checkpoints_prefix(record.data))]
        self.check("checkpoints in the bucket", bool(ckpts),
                   f"{len(ckpts)} files under {keys.checkpoints_prefix(record.data)}")
        self.metrics(job_id)
        self.costed(record)
        self.no_instance_left()

    def metrics(self, job_id: str) -> None:
        """`jobplane metrics`: what the agent read from the output as it streamed it."""
        self.cloud.cli("metrics", job_id, echo=True)
        found = json.loads(self.cloud.cli("metrics", job_id, "--json").stdout or "{}").get("metrics", [])
        loss = [p[2] for m in found if m["name"] == "loss" for p in m["points"]]
        self.check("metrics: the loss fell", len(loss) > 1 and loss[-1] < loss[0],
                   f"{loss[0]:.6g} -> {loss[-1]:.6g} over {len(loss)} points" if loss else "no loss points")

    def costed(self, record: Any) -> None:
        """The finished job's estimated cost, and the notification its end published (the console shows it)."""
        from jobplane.views import cost

        used = record.usage[-1] if record.usage else None
        self.check("cost estimated", used is not None and used.price is not None,
                   cost.describe_attempt(used, record.updated_at) if used else "no attempt recorded")
        line = f"notified    {record.id} {record.state}"
        log = self.cloud.state_dir / "local-cloud.log"
        seen = poll(lambda: line in log.read_text(errors="replace"), 60)
        self.check("notification published", bool(seen), line if seen else f"no '{line}' in {log} after 60s")

    def preemption(self) -> None:
        """A Spot VM reclaimed mid-run: the agent syncs the checkpoint, rerun starts attempt 2, which resumes."""
        job_id = self.submit(self.specs["spot"])
        self.cloud.cli("wait", job_id, "--for", "running", "--timeout", f"{self.timeout:.0f}s", echo=True)
        reg = self.cloud.registry()
        if not poll(lambda: checkpoint_steps(reg, job_id), self.timeout):
            self.check("Spot job checkpointed", False, f"no checkpoint in the bucket after {self.timeout:.0f}s; "
                       f"the job is {reg.job(job_id).state}")
            return
        self.cloud.cli("local", "preempt", job_id, "--grace", "10", echo=True)
        report = poll(lambda: exit_report(reg, job_id, 1), 120) or {}
        synced = max(checkpoint_steps(reg, job_id), default=0)  # attempt 2 has not started yet
        self.check("checkpoint synced on the Spot notice", report.get("reason") == "preempted" and synced > 0,
                   f"attempt 1 exited '{report.get('reason')}' with ckpt-{synced} in the bucket")
        code, _ = self.follow("logs", job_id, "-f")
        record = reg.job(job_id)
        self.check("Spot job SUCCEEDED on attempt 2", record.state == "SUCCEEDED" and record.attempt == 2 and code == 0,
                   f"{record.state} on attempt {record.attempt}, {record.restarts} restart(s); logs -f exited {code}")
        second = self.cloud.cli("logs", job_id, "--attempt", "2").stdout
        resumed = next((line for line in second.splitlines() if line.startswith("resuming from step")), "")
        self.check("attempt 2 resumed from the synced checkpoint", resumed.startswith(f"resuming from step {synced} "),
                   resumed or "no 'resuming from step' line in attempt 2's log")

    def uptime_cap(self, job_id: str) -> None:
        """A job that would run for days: a stop request at its cap minus the grace, then TIMED_OUT."""
        code, _ = self.follow("logs", job_id, "-f")
        reg = self.cloud.registry()
        record = reg.job(job_id)
        self.check("runaway job TIMED_OUT at its uptime cap", record.state == "TIMED_OUT" and code == 4,
                   f"{record.state}: {record.reason}; logs -f exited {code}")
        stop: dict[str, Any] = reg.get_json(keys.stop_request(job_id)) if exists(reg, keys.stop_request(job_id)) else {}
        report = exit_report(reg, job_id, record.attempt) or {}
        self.check("the uptime cap asked it to stop first", stop.get("by") == "uptime-cap",
                   f"stop request: {stop.get('reason')}; the agent exited '{report.get('reason')}'")

    def start_max_run_duration(self) -> str:
        """GCE's own uptime cap: with the uptime-cap function paused (as if it failed), only the VM's
        maxRunDuration can stop this job. It runs while the happy path does."""
        self.cloud.cli("local", "pause", "uptime_cap", echo=True)
        return self.submit(self.specs["max_run"])

    def max_run_duration(self, job_id: str) -> None:
        """At creation + maxRunDuration GCE runs the VM's shutdown-script, whose SIGTERM makes the agent stop the
        job, sync and report; then GCE deletes the VM, and the check records the job TIMED_OUT."""
        code, _ = self.follow("logs", job_id, "-f")
        self.cloud.cli("local", "pause", "uptime_cap", "--resume", echo=True)
        reg = self.cloud.registry()
        record = reg.job(job_id)
        report = exit_report(reg, job_id, record.attempt) or {}
        stopped = exists(reg, keys.stop_request(job_id))
        console = (self.cloud.state_dir / "local-cloud.log").read_text()
        # VM names start with jobplane-<6 hex of the deployment's sha256>-
        self.check("the console said GCE capped it", re.search(
            r"capped +us-central1-\w/jobplane-[0-9a-f]{6}-demo-max-run-\S+ \(.*\): maxRunDuration reached", console)
            is not None)
        self.check("GCE's maxRunDuration ended the job TIMED_OUT", record.state == "TIMED_OUT" and code == 4
                   and not stopped, f"{record.state}: {record.reason}; logs -f exited {code}; "
                                    f"{'a' if stopped else 'no'} stop request from the functions")
        said = self.cloud.cli("logs", job_id).stdout
        self.check("its shutdown-script stopped the agent first", report.get("reason") == "stopped" and
                   "SIGTERM: stopped" in said, f"the agent exited '{report.get('reason')}'" +
                   ("" if "SIGTERM" in said else "; no SIGTERM in its log"))

    def no_instance_left(self) -> None:
        left = wait_for_no_instances(self.cloud, 120)
        self.check("no instance left running", not left, f"after 120s still running: {', '.join(left)}" if left else "")

    def finish(self) -> int:
        code = self.cloud.stop()
        self.check("local cloud stopped cleanly", code == 0, f"exit code {code}")
        left = self.cloud.leftovers()
        self.check("no process or port left behind", not left, ", ".join(left))
        failed = [name for name, ok, _ in self.results if not ok]
        print(("demo FAILED: " + "; ".join(failed)) if failed else "demo passed", flush=True)
        return 1 if failed else 0


def poll(check: Callable[[], Any], timeout: float) -> Any:
    """check()'s first truthy value within timeout, else None: a demo step records a failed check and goes on."""
    try:
        return wait_for("a demo step's condition", check, timeout, 0.5)
    except WaitTimeout:
        return None


def exists(reg: Any, key: str) -> bool:
    return any(k == key for k, _, _ in reg.listing(key))


def checkpoint_steps(reg: Any, job_id: str) -> list[int]:
    """Steps of the ckpt-<step>.npz files synced into the bucket."""
    names = (k.rsplit("/", 1)[-1] for k, _, _ in reg.listing(keys.checkpoints_prefix(reg.job(job_id).data)))
    return [int(m.group(1)) for name in names if (m := re.fullmatch(r"ckpt-(\d+)\.npz", name))]


def exit_report(reg: Any, job_id: str, attempt: int, rank: int = 0) -> dict[str, Any] | None:
    key = keys.exit_report(job_id, attempt, rank)
    return dict(reg.get_json(key)) if exists(reg, key) else None


def wait_for_no_instances(cloud: CloudProcess, timeout: float) -> list[str]:
    """Wait until no managed VM is pending or running; return those still up at the deadline."""
    def up() -> list[str]:
        return [f"{i.id} ({i.job_id or 'no job'})" for i in cloud.vms() if i.state in ("pending", "running")]

    return [] if poll(lambda: not up(), timeout) else up()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobplane.local.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--cloud", choices=sorted(SPECS), default="aws", help="which local cloud (default: aws)")
    parser.add_argument("--state-dir", type=Path, help="default: a fresh temporary directory")
    parser.add_argument("--timeout", type=float, default=150, help="seconds each job may take")
    args = parser.parse_args(argv)
    started = time.monotonic()
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="jobplane-demo-"))
    print(f"starting the local {args.cloud} cloud (state in {state_dir}) ...", flush=True)
    cloud = CloudProcess(state_dir, cloud=args.cloud, ui=True)
    demo = Demo(cloud, args.timeout)
    try:
        cloud.start()
        print("local cloud up: " + ", ".join(f"{k}={cloud.state[k]}" for k in ENDPOINTS if k in cloud.state),
              flush=True)
        demo.run()
    except Exception as exc:  # the demo reports, never hides, a failure
        demo.check("demo ran", False, f"{type(exc).__name__}: {exc}")
    finally:
        code = demo.finish()
    print(f"demo took {time.monotonic() - started:.0f}s", flush=True)
    if code == 0 and args.state_dir is None:
        shutil.rmtree(state_dir, ignore_errors=True)  # kept on failure: console logs of every instance
    elif code:
        print(f"state, function logs and instance consoles kept in {state_dir}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
