"""Fixtures for running the real agent as a subprocess against moto (S3) and the fake IMDS; and for driving its
background loop step by step in memory, on a manual clock."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from jobplane.agent.background import MIN_WAIT, Background
from jobplane.agent.checkpoints import CheckpointSync
from jobplane.agent.output import OutputLog
from jobplane.agent.run import Outcome, Run
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED, CredentialsRefused, NotFound, Progress
from jobplane.clouds.memory import MemoryStore
from jobplane.clouds.s3 import S3Store
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.model import keys
from jobplane.model.records import ClusterFile
from jobplane.model.spec import JobSpec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.agent.clock import ManualClock
from tests.helpers import data_of
from tests.warm import Process, Warm

BUCKET = "jobplane-agent-test"
ROOT = "reg"  # a non-empty registry root, so every key the agent writes must honour it
FAST = ["--log-interval", "0.3", "--heartbeat-interval", "0.5", "--checkpoint-interval", "0.5",
        "--checkpoint-settle", "0.5", "--poll-interval", "0.3", "--cluster-timeout", "20"]
LOOP_DATA = keys.JobData("loop-job", "team-loop")  # where the loop's job keeps its data


def tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Node:
    proc: Process
    imds: FakeImds
    ml_root: Path
    console: Path

    def wait(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout=timeout)


@dataclass
class World:
    """A bucket in moto, a registry in it, and the agents and fake IMDSes a test starts."""

    reg: Registry
    tmp: Path
    warm: Warm
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.poweroff_log = self.tmp / "poweroff.log"
        shim = self.tmp / "poweroff-shim"
        shim.write_text(f'#!/bin/sh\necho "$@" >> "{self.poweroff_log}"\n')
        shim.chmod(0o755)
        self.poweroff_cmd = f"{shim} -h now"
        # and if anything ever fell back to the real command, a PATH shim records that instead
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        self.real_shutdown_log = self.tmp / "REAL-shutdown.log"
        for name in ("shutdown", "poweroff", "halt"):
            (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$@" >> "{self.real_shutdown_log}"\n')
            (bin_dir / name).chmod(0o755)
        self.path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"

    def seed(self, job_id: str, spec: dict[str, Any], *, code: dict[str, str] | None = None,
             hosts: tuple[str, ...] = ("10.0.0.1",)) -> None:
        """job.json (QUEUED -> LAUNCHING at attempt 1), cluster.json and the code bundle, as the launcher
        and `jobplane submit` would leave them."""
        self.reg.create_job(job_id, JobSpec.model_validate({"instance_type": "t3.micro", **spec}))
        instances = [f"i-{job_id[:8]}{rank:08x}" for rank in range(len(hosts))]
        self.reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=instances)
        self.reg.put_json(keys.cluster(job_id, 1), ClusterFile(
            job_id=job_id, attempt=1, hosts=list(hosts), instances=instances, master_addr=hosts[0],
            num_nodes=len(hosts), instance_type="t3.micro", zone="us-east-1a").body())
        if code is not None:
            self.reg.store.put(self.reg.key(keys.code_bundle(data_of(self.reg, job_id))), tarball(code))

    def start(self, job_id: str, rank: int = 0, extra: list[str] | None = None,
              env_only: dict[str, str] | None = None, attempt: int = 1) -> Node:
        """One agent with flags; or, given env_only, configured by environment alone, as the bootstrap
        script and the local cloud start it (`python3 -m jobplane.agent`, no flags). A later attempt runs
        on a fresh disk, as on a new VM."""
        imds = FakeImds(ImdsInstance(f"i-{job_id[:8]}{rank:08x}", launch_index=rank, tags={
            TAG_JOB_ID: job_id, TAG_ATTEMPT: str(attempt), TAG_MANAGED: "true"}))
        imds.start()
        ml_root = self.tmp / (f"node{rank}" if attempt == 1 else f"node{rank}-attempt{attempt}")
        console = self.tmp / f"console{rank}.log"
        env = {**os.environ, "PATH": self.path, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url}
        args = ["--cloud", "aws", "--bucket", BUCKET, "--root", ROOT, "--region", "us-east-1",
                "--ml-root", str(ml_root), "--poweroff-cmd", self.poweroff_cmd, *FAST, *(extra or [])]
        if env_only is not None:
            env.update({"JOBPLANE_ML_ROOT": str(ml_root), "JOBPLANE_POWEROFF_CMD": self.poweroff_cmd, **env_only})
            args = []
        with console.open("wb") as out:
            proc = self.warm.popen([sys.executable, "-m", "jobplane.agent", *args],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
        node = Node(proc, imds, ml_root, console)
        self.nodes.append(node)
        return node

    # ---- reading what the agent left in the bucket ---------------------------------------------------------
    def json(self, key: str) -> Any:
        return self.reg.get_json(key)

    def exists(self, key: str) -> bool:
        try:
            self.reg.get_bytes(key)
            return True
        except NotFound:
            return False

    def logs(self, job_id: str, rank: int = 0, attempt: int = 1) -> str:
        chunks = [k for k, _, _ in self.reg.listing(keys.logs_prefix(data_of(self.reg, job_id), attempt, rank))]
        return "".join(self.reg.get_bytes(k).decode() for k in chunks)

    def files(self, prefix: str) -> dict[str, bytes]:
        return {k.removeprefix(prefix): self.reg.get_bytes(k) for k, _, _ in self.reg.listing(prefix)}

    def checkpoint(self, job_id: str) -> dict[str, bytes]:
        """What a next attempt would restore: the files the newest manifests name, as restore fetches them."""
        dest = Path(tempfile.mkdtemp(dir=self.tmp, prefix="restore-"))
        prefix = self.reg.key(keys.checkpoints_prefix(data_of(self.reg, job_id)))
        CheckpointSync(self.reg.store, dest, prefix).restore(announce=False)
        return {p.relative_to(dest).as_posix(): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}

    def save_checkpoint(self, job_id: str, files: dict[str, bytes]) -> None:
        """Leave a checkpoint in the bucket the way an earlier attempt's agent does."""
        src = Path(tempfile.mkdtemp(dir=self.tmp, prefix="earlier-"))
        for name, data in files.items():
            (src / name).write_bytes(data)
        prefix = self.reg.key(keys.checkpoints_prefix(data_of(self.reg, job_id)))
        CheckpointSync(self.reg.store, src, prefix).sync(final=True)

    def next_attempt(self, job_id: str, attempt: int, hosts: tuple[str, ...] = ("10.0.0.1",)) -> None:
        """The rerun's bookkeeping: PREEMPTED, LAUNCHING at `attempt`, and its cluster.json."""
        self.reg.transition(job_id, State.PREEMPTED, expect=[State.LAUNCHING])
        self.reg.transition(job_id, State.LAUNCHING, expect=[State.PREEMPTED], attempt=attempt)
        self.reg.put_json(keys.cluster(job_id, attempt), ClusterFile(
            job_id=job_id, attempt=attempt, hosts=list(hosts), master_addr=hosts[0], num_nodes=len(hosts),
            instance_type="t3.micro", zone="us-east-1a").body())

    def close(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=10)
            node.imds.stop()


@pytest.fixture
def world(moto_endpoint: str, tmp_path: Path, warm: Warm) -> Iterator[World]:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    w = World(Registry(S3Store(BUCKET), ROOT), tmp_path, warm)
    try:
        yield w
    finally:
        w.close()
    assert not w.real_shutdown_log.exists(), "the agent ran the system's shutdown command"


def console_of(node: Node) -> str:
    return node.console.read_text(errors="replace")


def json_line(text: str, marker: str) -> Any:
    """The JSON printed after `marker` on one line of output."""
    for line in text.splitlines():
        if marker in line:
            return json.loads(line.split(marker, 1)[1])
    raise AssertionError(f"{marker!r} not in output:\n{text}")


# ---- the background loop in memory ---------------------------------------------------------------------------
class FlakyStore(MemoryStore):
    """Writes to keys containing a fragment fail the given number of times (-1: forever), then succeed: with an
    OSError, the way a network fails, or with `error` when one is set (CredentialsRefused, say)."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(clock)
        self.failures: dict[str, int] = {}
        self.error: Exception | None = None
        self._flaky_lock = threading.Lock()

    def _maybe_fail(self, key: str) -> None:
        with self._flaky_lock:
            for fragment, left in self.failures.items():
                if fragment in key and left != 0:
                    self.failures[fragment] = left - 1
                    raise self.error or OSError(f"injected: connection reset writing {key}")

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self._maybe_fail(key)
        return super().put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        self._maybe_fail(key)
        return super().put_if_absent(key, data, content_type, tags)

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        self._maybe_fail(key)
        return super().upload_file(key, path, content_type, progress)


class FakeMetadata:
    """The VM's metadata as the background loop asks it: a Spot notice once the test sets one."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.notice: dict[str, str] | None = None
        self.asked: list[float] = []  # when the loop asked for a notice
        self.on_ask: Callable[[], None] = lambda: None

    def instance_id(self) -> str:
        return "i-loop"

    def rank(self) -> int:
        return 0

    def tag(self, key: str) -> str | None:
        return None

    def preemption_notice(self) -> dict[str, str] | None:
        self.asked.append(self.clock.monotonic())
        self.on_ask()
        return self.notice


class Traced(Background):
    """The loop, saying when it ran what."""

    trace: list[tuple[float, str]]

    def poll(self) -> None:
        self.trace.append((self.clock.monotonic(), "poll"))
        super().poll()

    def ship_logs(self) -> None:
        self.trace.append((self.clock.monotonic(), "logs"))
        super().ship_logs()

    def heartbeat(self) -> None:
        self.trace.append((self.clock.monotonic(), "beat"))
        super().heartbeat()


@dataclass
class Loop:
    """A node's background loop on a manual clock, over an in-memory registry that keeps the clock's time."""

    clock: ManualClock
    store: FlakyStore
    reg: Registry
    md: FakeMetadata
    out: OutputLog
    run: Run
    background: Traced
    interrupts: list[Outcome]
    refused: list[CredentialsRefused]
    gpu: list[float | None]  # what nvidia-smi says now: gpu[0]

    def until(self, seconds: float) -> None:
        """Drive the loop as its thread would (a step, then a wait until the next is due) until the clock's
        monotonic() reads `seconds`: what is due then has run."""
        while True:
            wait = max(MIN_WAIT, self.background.step())
            if self.clock.monotonic() + wait > seconds:
                self.clock.advance(max(0.0, seconds - self.clock.monotonic()))
                return
            self.clock.advance(wait)

    def json(self, key: str) -> Any:
        return self.reg.get_json(key)

    def written_at(self, key: str) -> float:
        """When the object was last written, on the clock's monotonic() scale."""
        return (self.store.get(self.reg.key(key)).last_modified - self.clock.start).total_seconds()

    def chunks(self, stream: str = "logs") -> list[bytes]:
        prefix = (keys.logs_prefix if stream == "logs" else keys.metrics_prefix)(LOOP_DATA, 1, 0)
        return [self.reg.get_bytes(k) for k, _, _ in self.reg.listing(prefix)]


def make_loop(*, poll: float = 5.0, logs: float = 10.0, beat: float = 30.0, phase: str = "running") -> Loop:
    """The contract's intervals by default: on a manual clock they cost nothing."""
    clock = ManualClock()
    store = FlakyStore(clock)
    reg = Registry(store, "reg")
    md = FakeMetadata(clock)
    out = OutputLog(None, clock=clock)
    run = Run("loop-job", 1, 0, "i-loop", started_at=clock(), phase=phase, data=LOOP_DATA)
    interrupts: list[Outcome] = []
    refused: list[CredentialsRefused] = []
    gpu: list[float | None] = [None]
    background = Traced(reg, md, out, run, clock=clock, poll_interval=poll, log_interval=logs, heartbeat_interval=beat,
                        interrupted=lambda: bool(interrupts), interrupt=interrupts.append, lose_access=refused.append,
                        gpu_utilization=lambda: gpu[0])
    background.trace = []
    return Loop(clock, store, reg, md, out, run, background, interrupts, refused, gpu)


@pytest.fixture
def loop() -> Loop:
    return make_loop()
