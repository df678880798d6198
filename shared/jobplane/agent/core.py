"""The agent: runs one node of one attempt of one job, and reports what happened.

Cloud-neutral: it sees the registry (any ObjectStore), the VM's Metadata and a power_off callable.
Three threads: the main thread prepares, supervises the user process and reports; a background
thread writes heartbeats, ships log chunks and polls for a Spot notice or a stop request; a third
uploads complete checkpoint files and their manifest (jobplane.agent.checkpoints). Every
registry write is retried and no failure skips the exit report or the power-off.

SIGTERM or SIGINT (`on_signal`, installed by the entry point) is a stop request too: the VM is shutting
down (GCE's shutdown script, EC2's OS shutdown), often before the next poll has seen the notice. So is a
line of output that matches the spec's `stop_on` rules (`_stop_early`, from the thread reading the output):
the user process is stopped the same graceful way at once, and the exit report says why ("early-stop").
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import ValidationError

from jobplane import containers, keys, metrics, records
from jobplane.agent import gpu
from jobplane.agent.checkpoints import SETTLE
from jobplane.agent.container import Container, find_runtime
from jobplane.agent.idle import IdleMeter
from jobplane.agent.keeper import Keeper, Node
from jobplane.agent.layout import (
    Cluster,
    Layout,
    hyperparameters_file,
    resource_config,
    shard,
    user_env,
)
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.agent.transfer import TARBALL_SUFFIXES, fetch, fetch_tarball, keys_under
from jobplane.clouds.base import (
    LOG_OBJECT_TAG,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    CredentialsRefused,
    Metadata,
    NotFound,
    ObjectStore,
    PreconditionFailed,
)
from jobplane.metrics import EARLY_STOP
from jobplane.registry import Registry
from jobplane.spec import JobSpec

log = logging.getLogger("jobplane.agent")
T = TypeVar("T")

AGENT_ERROR = 125  # exit code when the agent itself could not run the job (like `docker run`)
REQUIREMENTS = "requirements.txt"
AGENT_SITE = str(Path(__file__).resolve().parents[2])  # where this agent's packages are (the bundle's site/)
_TICK = 0.2  # how often the main thread looks at the user process
MAX_CHUNK = 4 << 20  # bytes per log or metrics object: a chatty job writes more objects, never huge ones
# After SIGTERM the VM is assumed gone this soon: GCE hard-stops a Spot VM 30 s after its soft off (a
# Standard one after 120 s) and the guest spends a few of those reaching the shutdown script.
SIGNAL_BUDGET_S = 25.0
FINAL_SYNC_S = 30.0  # at most this much of the time left is kept for the final sync and the report
MIN_GRACE_S = 5.0


def grace_within(requested: float, left: float | None) -> float:
    """The user process's SIGTERM-to-SIGKILL grace when the VM goes away in `left` seconds (None: no
    known end): the spec's grace, but never more than half of what is left nor all but FINAL_SYNC_S of
    it, so the final checkpoint sync and the exit report still fit; and never under MIN_GRACE_S."""
    if left is None:
        return requested
    return min(requested, max(MIN_GRACE_S, left - min(FINAL_SYNC_S, left / 2)))
@dataclass(frozen=True)
class AgentConfig:
    """Intervals are upper bounds from the contract (logs 10 s, heartbeat 30 s, checkpoints 60 s,
    notice poll 5 s); tests and the local cloud make them shorter."""

    ml_root: Path = Path("/opt/ml")
    job_id: str | None = None  # else the instance's jobplane:job-id tag
    attempt: int | None = None  # else the jobplane:attempt tag
    log_interval: float = 10.0
    heartbeat_interval: float = 30.0
    checkpoint_interval: float = 60.0
    poll_interval: float = 5.0
    stop_grace: float | None = None  # else the spec's stop_grace
    cluster_timeout: float = 900.0  # cluster.json must appear within this
    identity_timeout: float = 120.0  # metadata must answer within this
    retry_attempts: int = 6
    retry_pause: float = 1.0
    checkpoint_settle: float = SETTLE  # where /proc cannot tell what is open: unchanged this long counts as complete

    def __post_init__(self) -> None:
        for name, cap in (("log_interval", 10), ("heartbeat_interval", 30), ("checkpoint_interval", 60),
                          ("poll_interval", 5)):
            value = getattr(self, name)
            if not 0 < value <= cap:
                raise ValueError(f"{name} must be > 0 and at most {cap} s, got {value}")


@dataclass
class Outcome:
    code: int | None
    reason: records.ExitReason
    notice: dict[str, str] | None = None
    error: str | None = None
    signal: str | None = None  # "SIGTERM" when a signal asked the agent to stop
    deadline: float | None = None  # time.monotonic() by which the VM is gone, when a signal says so
    stopped_by: str | None = None  # the stop request's `by` (uptime-cap, idle-gpu, cli), for the exit report
    stop_reason: str | None = None


@dataclass
class _Run:
    """What the agent learned about its job, filled in as it goes."""

    job_id: str
    attempt: int
    rank: int
    instance_id: str
    spec: JobSpec | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    phase: str = "starting"


class Agent:
    def __init__(self, registry: Registry, metadata: Metadata, config: AgentConfig, *, environ: Mapping[str, str],
                 power_off: Callable[[], None], stores: Callable[[str], ObjectStore] | None = None,
                 console: BinaryIO | None = None,
                 gpu_utilization: Callable[[], float | None] = gpu.gpu_utilization,
                 registry_login: Callable[[str], tuple[str, str] | None] | None = None) -> None:
        self.reg, self.md, self.cfg = registry, metadata, config
        self.registry_login = registry_login  # container registry host -> (user, password) with the VM's identity
        self.environ = environ  # the agent's own environment (its entry point's), the base of the user's
        self.gpu_utilization = gpu_utilization
        self._idle: IdleMeter | None = None  # set once cluster.json says the policy watches idle GPUs
        self.power_off = power_off
        self.stores = stores
        self.layout = Layout(config.ml_root)
        self.out = OutputLog(console)
        self._interrupt: Outcome | None = None
        self._interrupted = threading.Event()
        self._stop_background = threading.Event()
        self._seq = {"logs": 0, "metrics": 0}  # next chunk number of each stream
        self._marked_output = 0
        self._keeper: Keeper | None = None  # checkpoints and artifacts, once prepared
        self._ended_ns: int | None = None  # when the user process ended (wall clock, to compare with mtimes)
        self._refused: str | None = None  # why the vending function refused this VM its job's credentials
        self._container: Container | None = None  # where the job's phases run, once its image is pulled

    # ---- entry point -------------------------------------------------------------------------------------
    def _stop_early(self, why: str) -> None:
        """A stop_on rule matched (called by the thread reading the output, on that line): the main thread,
        woken at once, stops the user process as for a stop request, and the exit report says why."""
        if self._interrupt is None:
            self._interrupt = Outcome(None, EARLY_STOP, error=why)
            self._interrupted.set()
            self.out.note(f"stop_on: {why}")

    def on_signal(self, signum: int, frame: object = None) -> None:
        """SIGTERM / SIGINT handler (signal.signal(sig, agent.on_signal), from the main thread).

        It only records the request; the main thread acts on it within a tick. No I/O and no locks here:
        the handler runs between any two bytecodes of the main thread, even inside a lock it holds."""
        if self._interrupt is None:
            self._interrupt = Outcome(None, "stopped", signal=signal.Signals(signum).name,
                                      deadline=time.monotonic() + SIGNAL_BUDGET_S)

    def run(self) -> int:
        """Run the node to the end and power off. Returns 0 once the exit report is written."""
        run = self._identify()
        if run is None:
            self._power_off()
            return 2
        threads = [threading.Thread(target=self._background, args=(run,), name="agent-background", daemon=True),
                   threading.Thread(target=self._checkpointer, name="agent-checkpoints", daemon=True)]
        for thread in threads:
            thread.start()
        try:
            outcome = self._work(run)
        except CredentialsRefused as exc:
            self._lose_access(exc)
            outcome = self._interrupt or Outcome(None, "stopped")
        except Exception as exc:  # the report must still be written
            log.exception("agent failed")
            outcome = Outcome(AGENT_ERROR, "exit", error=f"{type(exc).__name__}: {exc}")
            self.out.note(f"agent error: {outcome.error}")
        self._stop_background.set()
        for thread in threads:
            thread.join(timeout=60)
        reported = self._finish(run, self._after_signal(outcome))
        self._power_off()
        return 0 if reported else 1

    # ---- identity ---------------------------------------------------------------------------------------
    def _identify(self) -> _Run | None:
        deadline = time.monotonic() + self.cfg.identity_timeout
        while True:
            try:
                job_id = self.cfg.job_id or self.md.tag(TAG_JOB_ID)
                attempt = self.cfg.attempt if self.cfg.attempt is not None else _int(self.md.tag(TAG_ATTEMPT))
                if job_id and attempt is not None:
                    return _Run(job_id, attempt, self.md.rank(), self.md.instance_id())
                problem = f"instance has no {TAG_JOB_ID} / {TAG_ATTEMPT} tags (pass --job / --attempt)"
            except Exception as exc:
                problem = f"metadata: {exc}"
            if time.monotonic() > deadline or self._interrupt is not None:
                log.error("cannot tell which job this node runs: %s", problem)
                return None
            log.warning("%s; retrying", problem)
            time.sleep(min(5.0, self.cfg.poll_interval))

    # ---- the job ----------------------------------------------------------------------------------------
    def _work(self, run: _Run) -> Outcome:
        record = self._retry("read job.json", lambda: self.reg.job(run.job_id))
        run.spec = record.spec
        self.out.watch(metrics.Extractor(record.spec.metrics, record.spec.stop_on), self._stop_early)
        if record.terminal or record.attempt > run.attempt:
            self.out.note(f"job is {record.state} at attempt {record.attempt}: this node ({run.attempt}) stands down")
            return Outcome(None, "stopped")
        self.out.note(f"job {run.job_id} attempt {run.attempt} rank {run.rank} on {run.instance_id}")
        run.phase = "waiting"
        cluster = self._wait_cluster(run)
        if cluster is None:
            return self._interrupt or Outcome(None, "stopped")
        run.phase = "preparing"
        if cluster.idle_window and cluster.idle_threshold is not None:
            self._idle = IdleMeter(cluster.idle_window, cluster.idle_threshold)
        env = self._prepare(run, record.spec, cluster)
        failed = self._pull(run, record.spec) or self._requirements(run, record.spec, env)
        if failed is not None:
            return failed
        for phase, command in (("setup", record.spec.setup), ("running", record.spec.run)):
            if not command or self._interrupt:
                continue
            run.phase = phase
            self.out.note(f"{phase}: {command.splitlines()[0][:200]}")
            outcome = self._supervise(self._phase(command, env), record.spec)
            if outcome.reason != "exit" or outcome.code != 0:
                return outcome
        return self._interrupt or Outcome(0, "exit")

    def _wait_cluster(self, run: _Run) -> Cluster | None:
        deadline = time.monotonic() + self.cfg.cluster_timeout
        key = keys.cluster(run.job_id, run.attempt)
        while self._interrupt is None:  # set by a poll (which also sets _interrupted) or a signal
            body: bytes | None = None
            try:
                body = self.reg.get_bytes(key)
            except NotFound:
                pass
            except Exception as exc:  # a network blip (any SDK's error) is not a missing cluster
                log.warning("reading %s: %s", key, exc)
            if body is not None:
                return Cluster.parse(body, run.rank)  # a malformed cluster.json is an error, not a wait
            if time.monotonic() > deadline:
                raise TimeoutError(f"{key} did not appear within {self.cfg.cluster_timeout:.0f} s")
            self._interrupted.wait(min(1.0, self.cfg.poll_interval))
        return None

    def _prepare(self, run: _Run, spec: JobSpec, cluster: Cluster) -> dict[str, str]:
        lay = self.layout
        for d in (lay.code_dir, lay.config_dir, lay.output_data_dir, lay.local(spec.artifacts_dir),
                  lay.local(spec.checkpoint_dir)):
            d.mkdir(parents=True, exist_ok=True)
        self._fetch_code(run.job_id, spec)
        for name, channel in spec.inputs.items():
            bucket, prefix = keys.split_uri(channel.uri)
            store = self._store(bucket)
            found = {info.key: info for info in keys_under(store, prefix)}
            mine = shard(list(found), run.rank, cluster.num_nodes) if channel.distribution == "sharded" else list(found)
            # a retry skips what already arrived (the state file remembers each file's size and version)
            moved = self._retry(f"input {name}", partial(fetch, store, [found[k] for k in mine], prefix,
                                                         lay.channel_dir(name), lay.input_dir / ".jobplane" / name))
            self.out.note(f"input {name}: {len(mine)} of {len(found)} objects: {moved.summary()}")
        keeper = Keeper(self.reg, lay, spec, Node(run.job_id, run.attempt, run.rank),
                        interval=self.cfg.checkpoint_interval, settle=self.cfg.checkpoint_settle, say=self.out.note,
                        step=lambda: self.out.step)
        keeper.restore(self._retry)
        self._keeper = keeper  # from now on the checkpointer thread uploads changes
        lay.resource_config.write_text(json.dumps(resource_config(cluster, run.rank), indent=1))
        lay.hyperparameters.write_text(json.dumps(hyperparameters_file(spec), indent=1))
        # in a container the job sees its own variables only: the image has its own PATH, home and tools
        return user_env(spec=spec, job_id=run.job_id, attempt=run.attempt, rank=run.rank, cluster=cluster,
                        layout=lay, num_gpus=gpu.gpu_count(), num_cpus=os.cpu_count() or 1,
                        base={} if spec.container else _user_base_env(self.environ))

    def _phase(self, command: str, env: dict[str, str]) -> UserProcess:
        if self._container is not None:
            return self._container.phase(command, self.layout.code_dir, env, self.out)
        return UserProcess(command, self.layout.code_dir, env, self.out)

    def _pull(self, run: _Run, spec: JobSpec) -> Outcome | None:
        """The job's container image, pulled before anything runs in it: with the VM's identity where the
        cloud's registry wants one (registry_login), else anonymously. A failure ends the job naming the field."""
        if spec.container is None:
            return None
        image = containers.normalize(spec.container.image)
        runtime = find_runtime(self.environ.get("PATH"))
        if runtime is None:
            return self._agent_error("container.image: this VM's image has no container runtime (podman or docker);"
                                     " use an image with one (the GPU images ship docker) or bake it into yours")
        run.phase = "pulling"
        host = containers.registry_host(image)
        login = self.registry_login(host) if self.registry_login is not None else None
        if login is not None:
            done = subprocess.run(containers.login_argv(runtime, host, login[0]), input=login[1].encode(),
                                  capture_output=True, timeout=120, check=False)
            self.out.note(f"container: logged in to {host} with this VM's identity (exit {done.returncode})")
            if done.returncode != 0:
                return self._agent_error(f"container.image: could not log in to {host}: "
                                         f"{done.stderr.decode(errors='replace').strip()[:300]}")
        self.out.note(f"container: pulling {image} with {Path(runtime).name}")
        outcome = self._supervise(UserProcess(containers.pull_argv(runtime, image), self.layout.ml_root,
                                              {"PATH": self.environ.get("PATH", os.defpath)}, self.out), spec)
        if outcome.reason != "exit":
            return outcome  # preempted or stopped meanwhile
        if outcome.code != 0:
            outcome.error = f"container.image: could not pull {image}: {self.out.last_line[:300]} " \
                            f"({Path(runtime).name} pull exited with code {outcome.code})"
            self.out.note(outcome.error)
            return outcome
        lay = self.layout
        self._container = Container(runtime, image, containers.name_for(run.job_id, run.attempt, run.rank),
                                    tuple(spec.container.args),
                                    _outermost([lay.ml_root, lay.local(spec.checkpoint_dir),
                                                lay.local(spec.artifacts_dir)]), gpu.gpu_count(),
                                    self.environ.get("PATH", os.defpath))
        return None

    def _agent_error(self, why: str) -> Outcome:
        self.out.note(why)
        return Outcome(AGENT_ERROR, "exit", error=why)

    def _requirements(self, run: _Run, spec: JobSpec, env: dict[str, str]) -> Outcome | None:
        """As on SageMaker: a requirements.txt in the code is installed before `setup`, with uv, into a job
        environment (seeded with pip, and seeing the image's own packages) that `python3` and `pip` in setup
        and run then mean. Its output goes to the job's log; a failure ends the job naming the file."""
        requirements = self.layout.code_dir / REQUIREMENTS
        if not requirements.is_file():
            return None
        if self._container is not None:
            return self._container_requirements(run, spec, env, requirements)
        venv = self.layout.job_env
        run.phase = "requirements"
        self.out.note(f"{REQUIREMENTS}: installing into {venv}")
        uv = _uv()
        uv_env = {**env, "UV_CACHE_DIR": env.get("UV_CACHE_DIR") or str(self.layout.ml_root / ".cache" / "uv")}
        steps = (("create the job environment", [uv, "venv", "--seed", "--system-site-packages", "--python",
                                                 sys.executable, str(venv)]),
                 ("install it", [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "-r",
                                 str(requirements)]))
        for what, argv in steps:
            outcome = self._supervise(UserProcess(shlex.join(argv), self.layout.code_dir, uv_env, self.out), spec)
            if outcome.reason != "exit":
                return outcome  # preempted or stopped meanwhile
            if outcome.code != 0:
                outcome.error = f"{REQUIREMENTS}: could not {what}: uv exited with code {outcome.code} (see the log)"
                self.out.note(outcome.error)
                return outcome
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}")
        self.out.note(f"{REQUIREMENTS}: installed; python3 and pip now mean {venv / 'bin'}")
        return None

    def _container_requirements(self, run: _Run, spec: JobSpec, env: dict[str, str], requirements: Path) -> \
            Outcome | None:
        """In a container, the image's own pip installs them into a directory on the VM that every phase
        mounts and finds on PYTHONPATH (each phase is a fresh container)."""
        assert self._container is not None
        site = self.layout.job_env / "container-site"
        run.phase = "requirements"
        self.out.note(f"{REQUIREMENTS}: installing with the image's pip into {site}")
        command = shlex.join(["python3", "-m", "pip", "install", "--no-input", "--target", str(site), "-r",
                              str(requirements)])
        outcome = self._supervise(self._container.phase(command, self.layout.code_dir, env, self.out), spec)
        if outcome.reason == "exit" and outcome.code != 0:
            outcome.error = f"{REQUIREMENTS}: could not install it in the container: pip exited with code " \
                            f"{outcome.code} (see the log)"
            self.out.note(outcome.error)
        if outcome.reason != "exit" or outcome.code != 0:
            return outcome
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        return None

    def _fetch_code(self, job_id: str, spec: JobSpec) -> None:
        if spec.code:
            bucket, key = keys.split_uri(spec.code)
            store = self._store(bucket)
            if key.endswith(TARBALL_SUFFIXES):
                fetch_tarball(store, key, self.layout.code_dir)
            else:
                fetch(store, keys_under(store, key), key, self.layout.code_dir)
            self.out.note(f"code from {spec.code}")
            return
        try:
            size = fetch_tarball(*self.reg.location(keys.code_bundle(job_id)), self.layout.code_dir)
        except NotFound:
            self.out.note("no code bundle: running in an empty code directory")
            return
        self.out.note(f"code bundle unpacked into {self.layout.code_dir} ({size} bytes)")

    def _store(self, bucket: str) -> ObjectStore:
        if self.stores is None:
            raise RuntimeError(f"no object store for bucket {bucket!r}: the agent was built without `stores`")
        return self.stores(bucket)

    def _supervise(self, proc: UserProcess, spec: JobSpec) -> Outcome:
        while True:
            code = proc.poll()
            interrupt = self._interrupt  # read once: a signal or the poll may set it at any moment
            if code is not None:
                self._ended_ns = time.time_ns()
                # a shutdown signals the whole service, user code too; a stop_on match stands whatever the code
                if interrupt is not None and (code != 0 or interrupt.reason == EARLY_STOP):
                    interrupt.code = code
                    return interrupt
                return Outcome(code, "exit")
            if interrupt is not None:
                grace = self._grace(spec, interrupt)
                cause = f" ({interrupt.signal} received)" if interrupt.signal else ""
                self.out.note(f"{interrupt.reason}{cause}: SIGTERM to {proc.what}, {grace:.0f} s grace")
                interrupt.code = proc.terminate(grace, frozen=self._frozen)
                self._ended_ns = time.time_ns()
                return interrupt
            self._interrupted.wait(_TICK)

    def _frozen(self) -> None:
        if self._keeper is not None:
            self._keeper.freeze()

    def _grace(self, spec: JobSpec, interrupt: Outcome) -> float:
        requested = float(self.cfg.stop_grace if self.cfg.stop_grace is not None else spec.stop_grace)
        return grace_within(requested, _seconds_left(interrupt))

    # ---- background: heartbeats, logs, notice / stop polling ------------------------------------------
    def _background(self, run: _Run) -> None:
        due = dict.fromkeys(("poll", "logs", "beat"), 0.0)
        every = {"poll": self.cfg.poll_interval, "logs": self.cfg.log_interval, "beat": self.cfg.heartbeat_interval}
        actions: dict[str, Callable[[_Run], None]] = {"poll": self._poll, "logs": self._ship_logs,
                                                      "beat": self._heartbeat}
        while not self._stop_background.is_set():
            for name, action in actions.items():
                if time.monotonic() >= due[name]:
                    try:
                        action(run)
                    except CredentialsRefused as exc:
                        self._lose_access(exc)
                    except Exception as exc:  # one failed write must not end the heartbeats
                        log.warning("background %s failed: %s", name, exc)
                    due[name] = time.monotonic() + every[name]
            self._stop_background.wait(max(0.05, min(due.values()) - time.monotonic()))

    def _poll(self, run: _Run) -> None:
        if self._interrupt is not None:
            return
        notice = self.md.preemption_notice()
        if notice is not None:
            self._interrupt = Outcome(None, "preempted", notice=notice)
        elif (stop := self._stop_request(run.job_id)) is not None:
            self._interrupt = Outcome(None, "stopped", stopped_by=stop.by, stop_reason=stop.reason)
        if self._interrupt is not None:
            asked = f"stop requested{f' by {self._interrupt.stopped_by}' if self._interrupt.stopped_by else ''}"
            self.out.note(f"{self._interrupt.reason}: {notice or asked}")
            self._interrupted.set()

    def _stop_request(self, job_id: str) -> records.StopRequest | None:
        """control/stop (who asked and why); None while there is none. One that does not parse still asks
        this node to stop (anonymously): stopping is the safe reading of a request nobody can read."""
        try:
            body = self.reg.get_bytes(keys.stop_request(job_id))
        except NotFound:
            return None
        try:
            return records.StopRequest.parse(body)
        except records.RecordError as exc:
            log.warning("%s", exc)
            return records.StopRequest(time=datetime.now(UTC), by="unknown", reason=str(exc))

    def _ship_logs(self, run: _Run) -> None:
        """The output since the last flush as log chunks, then its metric points as metrics chunks."""
        data = self.out.take()
        while data:
            piece, rest = data[:MAX_CHUNK], data[MAX_CHUNK:]
            try:
                self._put_chunk(run, "logs", piece)
            except Exception:
                self.out.give_back(data)  # nothing is lost: the next flush retries from here
                raise
            data = rest
        points = self.out.take_points()
        while points:
            n = size = 0
            while n < len(points) and (n == 0 or size + len(points[n]) <= MAX_CHUNK):  # whole lines only
                size += len(points[n])
                n += 1
            try:
                self._put_chunk(run, "metrics", b"".join(points[:n]))
            except Exception:
                self.out.give_back_points(points)
                raise
            points = points[n:]

    def _put_chunk(self, run: _Run, stream: str, data: bytes) -> None:
        """Chunks are create-only: a restarted agent skips past, never overwrites, old ones. Both streams carry
        the log tag, so the bucket's log lifecycle rule expires them together."""
        chunk, content_type = ((keys.log_chunk, "text/plain") if stream == "logs"
                               else (keys.metrics_chunk, "application/x-ndjson"))
        while True:
            key = chunk(run.job_id, run.attempt, run.rank, self._seq[stream])
            try:
                self.reg.put_if_absent(key, data, content_type, tags=dict([LOG_OBJECT_TAG]))
                self._seq[stream] += 1
                return
            except PreconditionFailed:
                self._seq[stream] += 1

    def _heartbeat(self, run: _Run) -> None:
        last = self.out.last_output_at
        utilization = self.gpu_utilization()
        beat = records.Heartbeat(time=datetime.now(UTC), instance_id=run.instance_id, rank=run.rank,
                                 attempt=run.attempt, phase=run.phase, last_output_at=last, gpu_util=utilization,
                                 step=self.out.step)
        self.reg.put_json(keys.heartbeat(run.job_id, run.attempt, run.rank), beat.body())
        meter = self._idle
        if meter is not None:  # after the heartbeat: the sweeper takes a mark as current when it is not older
            meter.add(time.monotonic(), utilization if run.phase == "running" else None)
            mean = meter.idle(time.monotonic())
            if mean is not None:
                self.reg.put_json(keys.idle_mark(run.job_id, run.attempt, run.rank),
                                  records.IdleMark(time=beat.time, mean_gpu_util=round(mean, 2), window=meter.window,
                                                   threshold=meter.threshold).body())
        seq = self.out.output_seq
        if seq != self._marked_output and last is not None:
            self.reg.put_json(keys.output_mark(run.job_id, run.attempt, run.rank),
                              records.OutputMark(time=last, step=self.out.step).body())
            self._marked_output = seq

    def _checkpointer(self) -> None:
        """Periodic checkpoint upload, in its own thread so a large upload never delays a notice."""
        while not self._stop_background.wait(self.cfg.checkpoint_interval):
            if self._keeper is None:
                continue  # not prepared yet
            try:
                self._keeper.periodic(self._stop_background)
            except CredentialsRefused as exc:
                self._lose_access(exc)
            except Exception as exc:
                log.warning("checkpoint sync failed; will retry: %s", exc)

    # ---- the end ----------------------------------------------------------------------------------------
    def _lose_access(self, exc: CredentialsRefused) -> None:
        """The control plane will not give this VM its job's credentials any more (its attempt is over, or it
        is not one of it): stop the job as for a stop request, then power off without trying to write."""
        if self._refused is not None:
            return
        self._refused = str(exc)
        self.out.note(f"storage credentials refused: {exc}: stopping; nothing more can reach the bucket")
        if self._interrupt is None:
            self._interrupt = Outcome(None, "stopped", error=f"credentials refused: {exc}", stopped_by="jobplane")
        self._interrupted.set()

    def _after_signal(self, outcome: Outcome) -> Outcome:
        """A signal stopped the node: preempted if the metadata says so (asked once, the VM is going away),
        else stopped. On a Spot VM the shutdown's SIGTERM usually beats the next notice poll."""
        if outcome.signal is None or outcome.reason != "stopped":
            return outcome
        try:
            outcome.notice = self.md.preemption_notice()
        except Exception as exc:
            log.warning("preemption check after %s failed: %s", outcome.signal, exc)
        if outcome.notice is not None:
            outcome.reason = "preempted"
        self.out.note(f"{outcome.signal}: {outcome.reason}" + (f" {outcome.notice}" if outcome.notice else ""))
        return outcome

    def _finish(self, run: _Run, outcome: Outcome) -> bool:
        ended = datetime.now(UTC)
        keeper = self._keeper
        if keeper is not None:
            cut_ns = keeper.torn_after(outcome.code, self._ended_ns)
            self._try("final checkpoint sync", lambda: keeper.final(outcome.notice, cut_ns))
            if outcome.reason != "preempted":
                self._try("artifacts upload", lambda: keeper.artifacts(cut_ns))
        self.out.note(f"finished: reason={outcome.reason} code={outcome.code}")
        # a run shorter than the heartbeat interval still leaves its last output time and step behind
        self._try("final heartbeat", lambda: self._heartbeat(run))
        self._try("final log sync", lambda: self._ship_logs(run))
        # the records are built inside _try too: whatever goes wrong, the power-off still follows
        if outcome.reason == "preempted":
            self._try("preempted marker", lambda: self.reg.mark_preempted(run.job_id, records.PreemptedMarker(
                attempt=run.attempt, rank=run.rank, notice=outcome.notice, instance_id=run.instance_id)))
        key = keys.exit_report(run.job_id, run.attempt, run.rank)
        return self._try("exit report", lambda: self.reg.put_json(key, _report(run, outcome, ended).body()))

    def _power_off(self) -> None:
        log.info("powering off")
        try:
            self.power_off()
        except Exception:
            log.exception("power-off failed; the uptime backstop will stop this VM")

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """fn() with exponential backoff; re-raises the last error after retry_attempts tries."""
        for attempt in range(1, self.cfg.retry_attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt == self.cfg.retry_attempts or isinstance(exc, ValidationError | CredentialsRefused):
                    raise  # not a blip
                log.warning("%s failed (try %d): %s", what, attempt, exc)
                time.sleep(min(30.0, self.cfg.retry_pause * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    def _try(self, what: str, fn: Callable[[], object]) -> bool:
        """Like _retry, but a final failure is logged, not raised: the steps after it still run. Once the job's
        credentials are refused, each step says it is impossible (once) and nothing is tried."""
        if self._refused is None:
            try:
                self._retry(what, fn)
                return True
            except CredentialsRefused as exc:
                self._lose_access(exc)
            except Exception:
                log.exception("%s: gave up after %d tries", what, self.cfg.retry_attempts)
                return False
        self.out.note(f"{what} impossible: the job's storage credentials were refused ({self._refused})")
        return False


def _report(run: _Run, outcome: Outcome, ended: datetime) -> records.ExitReport:
    stopped = outcome.reason == "stopped"
    return records.ExitReport(code=outcome.code, started_at=run.started_at, ended_at=ended, reason=outcome.reason,
                              instance_id=run.instance_id, error=outcome.error or None,
                              stopped_by=outcome.stopped_by if stopped else None,
                              stop_reason=outcome.stop_reason if stopped and outcome.stopped_by else None,
                              notice=outcome.notice or None)


def _seconds_left(interrupt: Outcome) -> float | None:
    """Seconds until the VM goes away: the signal's budget, else the notice's time; None when unknown."""
    if interrupt.deadline is not None:
        return interrupt.deadline - time.monotonic()
    when = (interrupt.notice or {}).get("time")
    if not when:
        return None
    try:
        return (datetime.fromisoformat(when.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
    except ValueError:
        return None


def _uv() -> str:
    """The uv binary: the one in the agent bundle (or this environment), else whatever is on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


def _user_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment for the user's processes, less the bundle's PYTHONPATH entry: the agent's
    packages (pydantic, boto3...) must not shadow the job's own."""
    env = dict(environ)
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != AGENT_SITE]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def _outermost(paths: list[Path]) -> tuple[Path, ...]:
    """The paths not inside another of them: one bind mount each."""
    return tuple(sorted({p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)}))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
