"""One local cloud (`jobplane local up` in a child process, AWS or GCP) per test module; stopped, and checked
to have left nothing behind, in the fixture's finalizer. A module that sets SHARES_CLOUDS (the clouds it uses) may be
handed the one the module before it on this worker used, if that module opted in too and left it quiet (Kept)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobplane.agent.process import marked_pids
from jobplane.local.cloud import merged
from jobplane.local.demo import REPO, CloudProcess
from jobplane.local.package_index import wheel_dir
from jobplane.local.waiting import WaitTimeout, wait_for
from jobplane.model import keys
from tests.warm import Process, Warm

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train"
# The commands that only talk to the cloud's APIs (ssh runs a process in the VM, `local up` is the cloud itself), and
# the `local` ones that only ask its control endpoint
IN_PROCESS = frozenset({"submit", "ls", "queue", "policy", "describe", "logs", "wait", "cancel", "checkpoints",
                        "sweep", "metrics", "cost"})
LOCAL_IN_PROCESS = frozenset({"preempt", "kill", "instance", "pause", "status", "down"})


class ModuleCloud(CloudProcess):
    """A module's local cloud, whose `jobplane` commands (IN_PROCESS) run in the test's process: the same click
    commands, environment and working directory a user's second shell gives them, without an interpreter and its
    imports each (0.6 CPU s a command, about a sixth of the scenario tier's CPU). A command while another runs (a
    thread) and the others (`jobplane ssh`) run as processes, forked warm (tests/warm.py); one that echoes, and every
    command of a module that asks for them, as fresh ones (tests/local/test_first_job.py: a new user's first job,
    process and all)."""

    _one_at_a_time = threading.Lock()  # a command swaps sys.stdout and os.environ while it runs

    def __init__(self, state_dir: Path, *, warm: Warm, **kwargs: Any) -> None:
        super().__init__(state_dir, **kwargs)
        self.warm = warm

    def spawn(self, argv: list[str], **popen: Any) -> Process:
        """`local up` forked warm: its interpreter and imports (the CLI's, the local cloud's, boto3) are paid once."""
        return self.warm.popen(argv, **popen)

    def cli(self, *args: str, timeout: float = 60, echo: bool = False) -> subprocess.CompletedProcess[str]:
        if echo:
            return super().cli(*args, timeout=timeout, echo=echo)
        if not in_process_command(args) or not self._one_at_a_time.acquire(blocking=False):
            return self.warm.run([sys.executable, "-m", "jobplane.cli", *args], env=self.env, text=True,
                                 timeout=timeout, capture_output=True, cwd=REPO)
        try:
            return in_process(args, {**self.exported, "JOBPLANE_LOCAL_STATE": str(self.state_dir)})
        finally:
            self._one_at_a_time.release()


def in_process_command(args: tuple[str, ...]) -> bool:
    return bool(args) and (args[0] in IN_PROCESS or (args[0] == "local" and args[1:2] != () and
                                                      args[1] in LOCAL_IN_PROCESS))


def in_process(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`jobplane ARGS` through click's runner; an exception other than an exit is the traceback a process prints."""
    from click.testing import CliRunner

    from jobplane.cli import cli

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)
    finally:
        os.chdir(cwd)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["jobplane", *args], result.exit_code, result.stdout, stderr)


def running(tmp_path_factory: pytest.TempPathFactory, which: str, warm: Warm | None, baked_agent: bool = True,
            faults: tuple[float, int] | None = None) -> Iterator[CloudProcess]:
    """A local cloud for a test module; stopped, and checked to have left nothing behind, at its end. Its VMs
    boot as from an image baked with the agent (`local up --baked-agent`: about 2 CPU seconds less per VM) unless
    the module tests the bootstrap's download itself (tests/local/test_first_job.py). Its `jobplane` commands run in
    this process and warm (ModuleCloud), or without `warm`, each in a fresh interpreter. faults: (rate, seed) of
    `local up --faults`."""
    proc = started(tmp_path_factory, which, warm, baked_agent, faults)
    try:
        yield proc
    finally:
        stopped(proc)


def started(tmp_path_factory: pytest.TempPathFactory, which: str, warm: Warm | None, baked_agent: bool = True,
            faults: tuple[float, int] | None = None) -> CloudProcess:
    if not any(wheel_dir().glob("numpy-*.whl")):  # examples/train/requirements.txt installs it, from loopback
        pytest.skip(f"the local package index is empty ({wheel_dir()}): run `make local-index`")
    state_dir = tmp_path_factory.mktemp(f"local-{which}")
    proc = (CloudProcess(state_dir, cloud=which, baked_agent=baked_agent, faults=faults) if warm is None else
            ModuleCloud(state_dir, warm=warm, cloud=which, baked_agent=baked_agent, faults=faults))
    try:
        proc.start()
    except BaseException:
        stopped(proc)
        raise
    return proc


def stopped(proc: CloudProcess) -> None:
    code = proc.stop()
    left = proc.leftovers()
    assert not left, f"the local cloud left {left} behind"
    assert code == 0, f"local up exited {code}; see {proc.state_dir / 'local-cloud.log'}"


class Kept:
    """The baked-agent clouds a module hands to the next module on this worker (a cloud costs ~7 CPU seconds and
    ~12 s to start and stop), where both set SHARES_CLOUDS naming it. It is handed on only quiet: no VM process of
    it alive, nothing live or waiting in the registry (no active/ marker, drop, live sweep, `after:` wait, owner's
    node in use), its policy as `local up` wrote it, no function paused and no run's error. What a finished module
    leaves (ended jobs' records, data, events) stays: a module opts in only if no assertion of it reads beyond its
    own jobs' ids, owners and labels. Anything else stops, checked as a module's own cloud is."""

    def __init__(self) -> None:
        self.clouds: dict[str, tuple[CloudProcess, bytes]] = {}  # cloud -> it and its policy as started
        self.next: pytest.Item | None = None  # the item after the running one (pytest_runtest_protocol below)

    def lend(self, module: Any, which: str, tmp_path_factory: pytest.TempPathFactory,
             warm: Warm) -> Iterator[CloudProcess]:
        proc, policy = self.clouds.pop(which, (None, b""))
        if proc is None:
            proc = started(tmp_path_factory, which, warm)
            policy = proc.registry().get_bytes(keys.POLICY)
        handed = False
        try:
            yield proc
            following = None if self.next is None else self.next.module
            handed = (following not in (None, module) and which in getattr(following, "SHARES_CLOUDS", ())
                      and quiet(proc, policy) is None)
        finally:
            if handed:
                self.clouds[which] = (proc, policy)
            else:
                stopped(proc)

    def close(self) -> None:
        while self.clouds:
            stopped(self.clouds.popitem()[1][0])


def quiet(proc: CloudProcess, policy: bytes) -> str | None:
    """Why the cloud is not as a module may find it (see Kept), or None."""
    if proc.proc is None or proc.proc.poll() is not None:  # a module may end with `jobplane local down`
        return "it stopped"
    vm_processes = f"JOBPLANE_LOCAL_CLOUD={proc.state.get('cloud_id')}"
    try:  # a VM that powered off ends its processes within seconds
        wait_for("the VMs' processes to end", lambda: not marked_pids(vm_processes), 30, 0.5)
    except WaitTimeout:
        return "a VM's processes are alive"
    reg = proc.registry()
    for prefix in (keys.ACTIVE, keys.QUEUE, keys.ACTIVE_SWEEPS, keys.AFTER, keys.PREEMPTED, keys.CANCELS):
        if any(True for _ in reg.listing(prefix)):
            return f"keys under {prefix}"
    if reg.get_bytes(keys.POLICY) != policy:
        return "its policy changed"
    status = json.loads(cli_ok(proc, "local", "status"))
    if status["errors"] or status["paused"]:
        return f"errors {status['errors']}, paused {status['paused']}"
    usage = json.loads(cli_ok(proc, "queue", "--json"))
    if usage["jobs"] or any(o["in_use"] for o in usage["usage"]["owners"]):
        return "nodes in use or jobs waiting"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    kept = item.config.stash.get(KEPT, None)
    if kept is not None:
        kept.next = nextitem
    yield


KEPT = pytest.StashKey[Kept]()


@pytest.fixture(scope="session")
def kept(request: pytest.FixtureRequest, warm: Warm) -> Iterator[Kept]:
    """This worker's Kept (after `warm`, so stopped before it)."""
    request.config.stash[KEPT] = found = Kept()
    try:
        yield found
    finally:
        found.close()


def module_cloud(request: pytest.FixtureRequest, which: str, tmp_path_factory: pytest.TempPathFactory,
                 warm: Warm) -> Iterator[CloudProcess]:
    if which in getattr(request.module, "SHARES_CLOUDS", ()):
        yield from request.getfixturevalue("kept").lend(request.module, which, tmp_path_factory, warm)
    else:
        yield from running(tmp_path_factory, which, warm)


@pytest.fixture(scope="module")
def cloud(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          warm: Warm) -> Iterator[CloudProcess]:
    yield from module_cloud(request, "aws", tmp_path_factory, warm)


@pytest.fixture(scope="module")
def gcp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
        warm: Warm) -> Iterator[CloudProcess]:
    yield from module_cloud(request, "gcp", tmp_path_factory, warm)


def write_spec(directory: Path, name: str, run: str, **extra: str) -> Path:
    fields = {"name": name, "instance_type": "t3.micro", "spot": "true", "run": run, **extra}
    lines = [f"{k}: {v}" for k, v in fields.items()]
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def paced(command: str, first: float, later: float) -> str:
    """`run:` for `command --sleep S` (seconds per step, as examples/train and examples/tensorboard take them):
    `first` on attempt 1, `later` on the attempts after a preemption, so a test waits for the rest of a resumed run
    at a faster pace. Quoted for YAML."""
    pace = f'$([ "$JOBPLANE_ATTEMPT" = 1 ] && echo {first} || echo {later})'
    return json.dumps(f"{command} --sleep {pace}")


@contextmanager
def policy_over(cloud: CloudProcess, fields: Mapping[str, Any]) -> Iterator[None]:
    """The cloud's policy with these fields over it (a section merged field by field, as `local up --policy`
    merges), and the policy as it was after."""
    reg = cloud.registry()
    policy = reg.get_bytes(keys.POLICY)
    reg.store.put(keys.POLICY, yaml.safe_dump(merged(yaml.safe_load(policy), fields)).encode(), "application/yaml")
    try:
        yield
    finally:
        reg.store.put(keys.POLICY, policy, "application/yaml")


def cli_ok(cloud: CloudProcess, *args: str) -> str:
    """`jobplane ARGS`'s stdout; fails the test with its stderr if it exits non-zero."""
    done = cloud.cli(*args)
    assert done.returncode == 0, f"jobplane {' '.join(args)}: {done.stderr}"
    return done.stdout


def shell_code(directory: Path) -> Path:
    """Code for a job whose run is a shell line: no requirements.txt, so its VM installs nothing (examples/train's
    numpy costs a VM about a CPU second to unpack)."""
    code = directory / "shell-code"
    code.mkdir(exist_ok=True)
    (code / "README").write_text("a job whose run is a shell line\n")
    return code


def submit(cloud: CloudProcess, spec: Path, code: Path = TRAIN) -> str:
    """Submit a spec with its code; returns the job id."""
    return cli_ok(cloud, "submit", str(spec), "--code", str(code)).strip().splitlines()[-1]
