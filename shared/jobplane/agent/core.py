"""The agent: runs one node of one attempt of one job, and reports what happened.

Cloud-neutral: it sees the registry's objects (a RootedStore over any ObjectStore: it writes facts and reads its
job's record, never writes one), the VM's Metadata, a power_off callable and a clock (agent/clock.py). Four
threads: the main thread prepares (agent/environment.py), supervises the user process and reports; a background
thread writes heartbeats, ships log chunks and polls for a Spot notice or a stop request (agent/background.py); a
third uploads complete checkpoint files and their manifest (jobplane.agent.keeper); a fourth the job's TensorBoard
event files, when its spec has `tensorboard:` (jobplane.agent.tensorboard). Every registry write is retried and no
failure skips the exit report or the power-off.

SIGTERM or SIGINT (`on_signal`, installed by the entry point) is a stop request too: the VM is shutting
down (GCE's shutdown script, EC2's OS shutdown), often before the next poll has seen the notice. So is a
line of output that matches the spec's `stop_on` rules (`_stop_early`, from the thread reading the output):
the user process is stopped the same graceful way at once, and the exit report says why ("early-stop").
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import ValidationError

from jobplane.agent import gpu, secretenv
from jobplane.agent.background import Background
from jobplane.agent.checkpoints import SETTLE
from jobplane.agent.clock import SYSTEM, Clock
from jobplane.agent.environment import Environment
from jobplane.agent.idle import IdleMeter
from jobplane.agent.keeper import COPY_FREEZE, Keeper, Node
from jobplane.agent.layout import Cluster, Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.agent.run import AGENT_ERROR, Outcome, Run, hold_for
from jobplane.agent.system import SystemSampler
from jobplane.agent.tensorboard import EventUploader
from jobplane.clouds.base import (
    TAG_ATTEMPT,
    TAG_JOB_ID,
    AccessDenied,
    CredentialsRefused,
    Metadata,
    NotFound,
    ObjectStore,
)
from jobplane.model import keys, metrics, records
from jobplane.model.bounds import format_duration
from jobplane.model.metrics import EARLY_STOP
from jobplane.model.secrets import SecretMissing
from jobplane.model.spec import JobSpec
from jobplane.store.registry import read_job
from jobplane.store.rooted import RootedStore

log = logging.getLogger("jobplane.agent")
T = TypeVar("T")

_TICK = 0.2  # how often the main thread looks at the user process
# After SIGTERM the VM is assumed gone this soon: GCE hard-stops a Spot VM 30 s after its soft off (a
# Standard one after 120 s) and the guest spends a few of those reaching the shutdown script.
SIGNAL_BUDGET_S = 25.0
FINAL_SYNC_S = 30.0  # at most this much of the time left is kept for the final sync and the report
MIN_GRACE_S = 5.0
HOLD_MARGIN_S = 600  # a held VM outlives its hold by at most this if no sweep ends it
_HOLD_TICK = 1.0  # how often a held agent looks for a signal
MAX_FREEZE = 10.0  # the most checkpoint_freeze may be: longer, and a frozen rank stalls its peers' collectives


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
    checkpoint_freeze: float = COPY_FREEZE  # the job may be frozen this long for a copy of a file it rewrites in place

    def __post_init__(self) -> None:
        for name, cap in (("log_interval", 10), ("heartbeat_interval", 30), ("checkpoint_interval", 60),
                          ("poll_interval", 5)):
            value = getattr(self, name)
            if not 0 < value <= cap:
                raise ValueError(f"{name} must be > 0 and at most {cap} s, got {value}")
        if not 0 <= self.checkpoint_freeze <= MAX_FREEZE:
            raise ValueError(f"checkpoint_freeze must be between 0 and {MAX_FREEZE} s, got {self.checkpoint_freeze}")


class Agent:
    def __init__(self, registry: RootedStore, metadata: Metadata, config: AgentConfig, *, environ: Mapping[str, str],
                 power_off: Callable[[], None], stores: Callable[[str], ObjectStore] | None = None,
                 console: BinaryIO | None = None,
                 gpu_utilization: Callable[[], float | None] = gpu.gpu_utilization,
                 gpu_readings: Callable[[], list[gpu.GpuReading]] = gpu.MACHINE.read,
                 registry_login: Callable[[str], tuple[str, str] | None] | None = None,
                 secrets: Callable[[str, str], bytes] | None = None, clock: Clock = SYSTEM) -> None:
        self.reg, self.md, self.cfg, self.clock = registry, metadata, config, clock
        self.gpu_utilization, self.gpu_readings = gpu_utilization, gpu_readings
        self.power_off = power_off
        self.secrets = secrets  # (owner, name) -> value, with the job's credentials (agent/secretenv.py)
        self.layout = Layout(config.ml_root)
        self.out = OutputLog(console, clock=clock)
        self.environment = Environment(registry, self.layout, self.out, environ=environ, supervise=self._supervise,
                                       retry=self._retry, stores=stores, registry_login=registry_login, clock=clock)
        self._interrupt: Outcome | None = None
        self._interrupted = threading.Event()
        self._stop_background = threading.Event()
        self._keeper: Keeper | None = None  # checkpoints and artifacts, once prepared
        self._events: EventUploader | None = None  # the spec's TensorBoard event files, once prepared
        self._proc: UserProcess | None = None  # the phase running now, or the last one
        self._ended_ns: int | None = None  # when the user process ended (wall clock, to compare with mtimes)
        self._signalled = False  # a signal arrived: a debug hold ends (the VM is going)
        self._refused: str | None = None  # why the vending function refused this VM its job's credentials

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
        self._signalled = True
        if self._interrupt is None:
            self._interrupt = Outcome(None, "stopped", signal=signal.Signals(signum).name,
                                      deadline=self.clock.monotonic() + SIGNAL_BUDGET_S)

    def run(self) -> int:
        """Run the node to the end and power off. Returns 0 once the exit report is written."""
        run = self._identify()
        if run is None:
            self._power_off()
            return 2
        background = Background(
            self.reg, self.md, self.out, run, clock=self.clock, poll_interval=self.cfg.poll_interval,
            log_interval=self.cfg.log_interval, heartbeat_interval=self.cfg.heartbeat_interval,
            interrupted=lambda: self._interrupt is not None, interrupt=self._interrupt_by,
            lose_access=self._lose_access, gpu_utilization=self.gpu_utilization)
        threads = [threading.Thread(target=background.run, args=(self._stop_background,),
                                    name="agent-background", daemon=True),
                   threading.Thread(target=self._checkpointer, name="agent-checkpoints", daemon=True),
                   threading.Thread(target=self._event_files, name="agent-tensorboard", daemon=True)]
        for thread in threads:
            thread.start()
        try:
            outcome = self._work(run, background)
        except CredentialsRefused as exc:
            self._lose_access(exc)
            outcome = self._interrupt or Outcome(None, "stopped")
        except Exception as exc:  # the report must still be written
            log.exception("agent failed")
            outcome = Outcome(AGENT_ERROR, "exit", error=f"{type(exc).__name__}: {exc}")
            self.out.note(f"agent error: {outcome.error}")
        secretenv.clean(run.job_id, run.rank)  # the job's file secrets outlive nothing of it
        self._stop_background.set()
        for thread in threads:
            thread.join(timeout=60)
        outcome = self._after_signal(outcome)
        hold = hold_for(run.spec, outcome)
        if hold:
            self.out.note(f"debug_hold {format_duration(hold)}: this VM stays up for `jobplane ssh {run.job_id}` "
                          "until the hold ends (the sweeper terminates it then)")
        reported = self._finish(run, background, outcome)
        self._hold(hold)
        self._power_off()
        return 0 if reported else 1

    def _hold(self, seconds: int) -> None:
        """Keep the VM up for a look: the sweeper terminates it at the hold's end, recorded in job.json; past
        that (and a margin for a late sweep), or at a signal, the agent powers off itself."""
        if not seconds:
            return
        log.info("debug hold: up for %d s more at most", seconds + HOLD_MARGIN_S)
        end = self.clock.monotonic() + seconds + HOLD_MARGIN_S
        while not self._signalled and (left := end - self.clock.monotonic()) > 0:
            self.clock.sleep(min(left, _HOLD_TICK))

    def _interrupt_by(self, outcome: Outcome) -> None:
        """The background loop found a Spot notice or a stop request (and said so in the log): the main thread,
        woken at once, stops the user process."""
        self._interrupt = outcome
        self._interrupted.set()

    # ---- identity ---------------------------------------------------------------------------------------
    def _identify(self) -> Run | None:
        deadline = self.clock.monotonic() + self.cfg.identity_timeout
        while True:
            try:
                job_id = self.cfg.job_id or self.md.tag(TAG_JOB_ID)
                attempt = self.cfg.attempt if self.cfg.attempt is not None else _int(self.md.tag(TAG_ATTEMPT))
                if job_id and attempt is not None:
                    return Run(job_id, attempt, self.md.rank(), self.md.instance_id(), started_at=self.clock())
                problem = f"instance has no {TAG_JOB_ID} / {TAG_ATTEMPT} tags (pass --job / --attempt)"
            except Exception as exc:
                problem = f"metadata: {exc}"
            if self.clock.monotonic() > deadline or self._interrupt is not None:
                log.error("cannot tell which job this node runs: %s", problem)
                return None
            log.warning("%s; retrying", problem)
            self.clock.sleep(min(5.0, self.cfg.poll_interval))

    # ---- the job ----------------------------------------------------------------------------------------
    def _work(self, run: Run, background: Background) -> Outcome:
        record = self._retry("read job.json", lambda: read_job(self.reg, run.job_id)[0])
        run.spec, run.data = record.spec, record.data
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
        background.idle = IdleMeter.watching(cluster.idle_window, cluster.idle_threshold)
        if record.spec.system_metrics_interval:
            background.watch_system(SystemSampler(self.layout.ml_root, self.gpu_readings),
                                    record.spec.system_metrics_interval)
        self.environment.fetch(run, record.spec, cluster)
        keeper = Keeper(self.reg, self.layout, record.spec, Node(run.job_id, run.attempt, run.rank, record.data.owner),
                        interval=self.cfg.checkpoint_interval, settle=self.cfg.checkpoint_settle, say=self.out.note,
                        step=lambda: self.out.step, clock=self.clock, processes=lambda: self._proc,
                        copy_freeze=self.cfg.checkpoint_freeze)
        keeper.restore(self._retry)
        self._keeper = keeper  # from now on the checkpointer thread uploads changes
        if record.spec.tensorboard is not None:  # and the TensorBoard thread the event files
            self._events = EventUploader(self.reg, self.layout.local(record.spec.tensorboard.log_dir), record.data,
                                         run.attempt, run.rank, sleep=self.clock.sleep,
                                         redactor=lambda: self.out.redactor)
        env = self.environment.configure(run, record.spec, cluster)
        try:
            values = self._read_secrets(record.spec)
            env.update(secretenv.variables(record.spec, values,
                                           lambda: secretenv.secrets_dir(run.job_id, run.rank)))
            login = secretenv.registry_login(record.spec, values)
        except secretenv.SecretError as exc:
            self.out.note(str(exc))
            return Outcome(AGENT_ERROR, "exit", error=str(exc))
        failed = (self.environment.pull(run, record.spec, login)
                  or self.environment.requirements(run, record.spec, env))
        if failed is not None:
            return failed
        for phase, command in (("setup", record.spec.setup), ("running", record.spec.run)):
            if not command or self._interrupt:
                continue
            run.phase = phase
            self.out.note(f"{phase}: {command.splitlines()[0][:200]}")
            outcome = self._supervise(self.environment.phase(command, env), record.spec)
            if outcome.reason != "exit" or outcome.code != 0:
                return outcome
        return self._interrupt or Outcome(0, "exit")

    def _read_secrets(self, spec: JobSpec) -> dict[str, bytes]:
        """The spec's secrets, read before anything of the job runs, and redacted from all the output from then on."""
        if not spec.secret_names:
            return {}
        if self.secrets is None:
            raise secretenv.SecretError("secrets: this cloud's agent reads no secrets")
        read = self.secrets
        try:
            values = self._retry("read secrets", lambda: secretenv.read_all(spec, read))
        except (AccessDenied, SecretMissing) as exc:
            raise secretenv.SecretError(f"secrets: {exc}") from None
        self.out.redact_with(list(values.values()))
        self.out.note(f"secrets: {', '.join(spec.secret_names)} read (redacted from the output)")
        return values

    def _wait_cluster(self, run: Run) -> Cluster | None:
        deadline = self.clock.monotonic() + self.cfg.cluster_timeout
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
            if self.clock.monotonic() > deadline:
                raise TimeoutError(f"{key} did not appear within {self.cfg.cluster_timeout:.0f} s")
            self.clock.wait(self._interrupted, min(1.0, self.cfg.poll_interval))
        return None

    def _supervise(self, proc: UserProcess, spec: JobSpec) -> Outcome:
        self._proc = proc  # the keeper freezes it for copies, and never looks at its files once it is stopping
        while True:
            code = proc.poll()
            interrupt = self._interrupt  # read once: a signal or the poll may set it at any moment
            if code is not None:
                self._ended_ns = time.time_ns()  # the files' clock: compared with their mtimes
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
                self._ended_ns = time.time_ns()  # the files' clock: compared with their mtimes
                return interrupt
            self.clock.wait(self._interrupted, _TICK)

    def _frozen(self) -> None:
        if self._keeper is not None:
            self._keeper.freeze()

    def _grace(self, spec: JobSpec, interrupt: Outcome) -> float:
        requested = float(self.cfg.stop_grace if self.cfg.stop_grace is not None else spec.stop_grace)
        return grace_within(requested, self._seconds_left(interrupt))

    def _seconds_left(self, interrupt: Outcome) -> float | None:
        """Seconds until the VM goes away: the signal's budget, else the notice's time; None when unknown."""
        if interrupt.deadline is not None:
            return interrupt.deadline - self.clock.monotonic()
        when = (interrupt.notice or {}).get("time")
        if not when:
            return None
        try:
            return (datetime.fromisoformat(when.replace("Z", "+00:00")) - self.clock()).total_seconds()
        except ValueError:
            return None

    def _checkpointer(self) -> None:
        """Periodic checkpoint upload, in its own thread so a large upload never delays a notice."""
        wait = self.cfg.checkpoint_interval
        while not self.clock.wait(self._stop_background, wait):
            wait = self.cfg.checkpoint_interval
            if self._keeper is None:
                continue  # not prepared yet
            try:
                wait = self._keeper.periodic(self._stop_background)
            except CredentialsRefused as exc:
                self._lose_access(exc)
            except Exception as exc:
                log.warning("checkpoint sync failed; will retry: %s", exc)

    def _event_files(self) -> None:
        """TensorBoard's event files up as they grow, every checkpoint interval, in a thread of their own (a
        profiler trace can be large)."""
        while not self.clock.wait(self._stop_background, self.cfg.checkpoint_interval):
            if self._events is None:
                continue
            try:
                self._events.sync()
            except CredentialsRefused as exc:
                self._lose_access(exc)
            except Exception as exc:
                log.warning("TensorBoard upload failed; will retry: %s", exc)

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

    def _finish(self, run: Run, background: Background, outcome: Outcome) -> bool:
        ended = self.clock()
        keeper = self._keeper
        if keeper is not None:
            cut_ns = keeper.torn_after(outcome.code, self._ended_ns)
            self._try("final checkpoint sync", lambda: keeper.final(outcome.notice, cut_ns))
            if outcome.reason != "preempted":
                self._try("artifacts upload", lambda: keeper.artifacts(cut_ns))
        events = self._events
        if events is not None:  # after the checkpoints: at a preemption those matter more
            self._try("TensorBoard upload", events.sync)
        self.out.note(f"finished: reason={outcome.reason} code={outcome.code}")
        # a run shorter than the heartbeat interval still leaves its last output time and step behind
        self._try("final heartbeat", background.heartbeat)
        self._try("final log sync", background.ship_logs)
        self._try("final system metrics", background.ship_system)
        # the records are built inside _try too: whatever goes wrong, the power-off still follows
        if outcome.reason == "preempted":
            marker = keys.preempted_marker(run.job_id)
            self._try("preempted marker", lambda: self.reg.put_json(marker, records.PreemptedMarker(
                attempt=run.attempt, rank=run.rank, notice=outcome.notice, instance_id=run.instance_id).body()))
        key = keys.exit_report(run.job_id, run.attempt, run.rank)
        report = exit_report(run, outcome, ended, self.out.redactor.text)
        return self._try("exit report", lambda: self.reg.put_json(key, report.body()))

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
                final = ValidationError | CredentialsRefused | AccessDenied | SecretMissing
                if attempt == self.cfg.retry_attempts or isinstance(exc, final):
                    raise  # not a blip
                log.warning("%s failed (try %d): %s", what, attempt, exc)
                self.clock.sleep(min(30.0, self.cfg.retry_pause * 2 ** (attempt - 1)))
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


def exit_report(run: Run, outcome: Outcome, ended: datetime,
                redact: Callable[[str], str] = lambda text: text) -> records.ExitReport:
    """The node's exit report: who asked it to stop and why only when it stopped (stop_reason only with a `by`).
    Its texts redacted (the job's secrets: the functions quote them in reasons and notifications), then cut."""
    stopped = outcome.reason == "stopped"
    cut = records.MAX_TEXT  # a report stays within what a check reads (records.MAX_FACT_BYTES)
    return records.ExitReport(code=outcome.code, started_at=run.started_at, ended_at=ended, reason=outcome.reason,
                              instance_id=run.instance_id, error=redact(outcome.error)[:cut] if outcome.error else None,
                              stopped_by=outcome.stopped_by if stopped else None,
                              stop_reason=redact(outcome.stop_reason)[:cut] if stopped and outcome.stopped_by
                              and outcome.stop_reason else None,
                              notice=outcome.notice or None)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
