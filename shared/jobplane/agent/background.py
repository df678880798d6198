"""The agent's background loop, in a thread of its own beside the supervision of the user process: heartbeats
(with the rank's output and idle-GPU marks), the output's log and metrics chunks, the poll for a Spot
notice or a stop request, and the system metrics' samples (once the spec says how often: `watch_system`).

Each of them runs when it is due, and is next due its interval after it returned; one that fails is
logged and tried again when next due, so a failed write never ends the heartbeats. `step` runs what is due
and says how long until the next; `run` is the thread's loop around it. What the loop finds that ends the
run (a notice, a stop request) it hands to the core through `interrupt`; a refusal of the job's credentials
through `lose_access`. Every time it reads goes through the agent's clock, so tests drive it step by step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jobplane.agent.clock import Clock
from jobplane.agent.idle import IdleMeter
from jobplane.agent.output import OutputLog
from jobplane.agent.run import Outcome, Run
from jobplane.agent.system import SystemSampler
from jobplane.clouds.base import LOG_OBJECT_TAG, CredentialsRefused, Metadata, NotFound, PreconditionFailed
from jobplane.model import keys, records, sysmetrics
from jobplane.store.rooted import RootedStore

log = logging.getLogger("jobplane.agent")

MAX_CHUNK = 4 << 20  # bytes per log or metrics object: a chatty job writes more objects, never huge ones
MIN_WAIT = 0.05  # the loop never waits less between two looks at what is due
MAX_SYSTEM_BACKLOG = 15 * sysmetrics.SAMPLES_PER_CHUNK  # samples kept while the bucket refuses them; older go


class Background:
    def __init__(self, reg: RootedStore, md: Metadata, out: OutputLog, run: Run, *, clock: Clock,
                 poll_interval: float, log_interval: float, heartbeat_interval: float,
                 interrupted: Callable[[], bool], interrupt: Callable[[Outcome], None],
                 lose_access: Callable[[CredentialsRefused], None],
                 gpu_utilization: Callable[[], float | None]) -> None:
        self.reg, self.md, self.out, self.run_info, self.clock = reg, md, out, run, clock
        self.interrupted = interrupted  # the core already has a reason to stop (a signal, stop_on, this loop)
        self.interrupt = interrupt  # this loop found one: a notice or a stop request
        self.lose_access, self.gpu_utilization = lose_access, gpu_utilization
        self.idle: IdleMeter | None = None  # set once cluster.json says the policy watches idle GPUs
        self.system: SystemSampler | None = None  # set by watch_system
        self._samples: list[bytes] = []  # system samples not shipped yet, one JSON line each
        self.every = {"poll": poll_interval, "logs": log_interval, "beat": heartbeat_interval}
        self.due = dict.fromkeys(self.every, 0.0)  # the clock's monotonic() at which each is next due
        self.seq = {"logs": 0, "metrics": 0}  # next chunk number of each stream (and "system", once watched)
        self._marked_output = 0
        self._actions: dict[str, Callable[[], None]] = {"poll": self.poll, "logs": self.ship_logs,
                                                        "beat": self.heartbeat}

    def run(self, stop: threading.Event) -> None:
        """The thread's loop: until stop is set, what is due, then a wait until the next is."""
        while not stop.is_set():
            self.clock.wait(stop, max(MIN_WAIT, self.step()))

    def step(self) -> float:
        """Run what is due, in the order poll, logs, heartbeat, system sample; return the seconds until the next is
        due."""
        for name, action in list(self._actions.items()):  # watch_system may add one meanwhile
            if self.clock.monotonic() >= self.due[name]:
                try:
                    action()
                except CredentialsRefused as exc:
                    self.lose_access(exc)
                except Exception as exc:  # one failed write must not end the heartbeats
                    log.warning("background %s failed: %s", name, exc)
                self.due[name] = self.clock.monotonic() + self.every[name]
        return min(self.due.values()) - self.clock.monotonic()

    # ---- notice / stop polling --------------------------------------------------------------------------
    def poll(self) -> None:
        if self.interrupted():
            return
        outcome: Outcome | None = None
        notice = self.md.preemption_notice()
        if notice is not None:
            outcome = Outcome(None, "preempted", notice=notice)
        elif (stop := self.stop_request()) is not None:
            outcome = Outcome(None, "stopped", stopped_by=stop.by, stop_reason=stop.reason)
        if outcome is not None:
            asked = f"stop requested{f' by {outcome.stopped_by}' if outcome.stopped_by else ''}"
            self.out.note(f"{outcome.reason}: {notice or asked}")
            self.interrupt(outcome)

    def stop_request(self) -> records.StopRequest | None:
        """control/stop (who asked and why); None while there is none. One that does not parse still asks
        this node to stop (anonymously): stopping is the safe reading of a request nobody can read."""
        try:
            body = self.reg.get_bytes(keys.stop_request(self.run_info.job_id))
        except NotFound:
            return None
        try:
            return records.StopRequest.parse(body)
        except records.RecordError as exc:
            log.warning("%s", exc)
            return records.StopRequest(time=self.clock(), by="unknown", reason=str(exc))

    # ---- log and metrics chunks -------------------------------------------------------------------------
    def ship_logs(self) -> None:
        """The output since the last flush as log chunks, then its metric points as metrics chunks; none until the
        job's record, which says where they go (JobRecord.data), has been read."""
        if self.run_info.data is None:
            return
        data = self.out.take()
        while data:
            piece, rest = data[:MAX_CHUNK], data[MAX_CHUNK:]
            try:
                self._put_chunk("logs", piece)
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
                self._put_chunk("metrics", b"".join(points[:n]))
            except Exception:
                self.out.give_back_points(points)
                raise
            points = points[n:]

    def _put_chunk(self, stream: str, data: bytes) -> None:
        """Chunks are create-only: a restarted agent skips past, never overwrites, old ones. Both streams carry
        the log tag, so the bucket's log lifecycle rule expires them together."""
        run = self.run_info
        assert run.data is not None  # ship_logs waits for it; system samples start after the record is read
        chunk, content_type = ((keys.log_chunk, "text/plain") if stream == "logs"
                               else (keys.system_chunk if stream == "system" else keys.metrics_chunk,
                                     "application/x-ndjson"))
        while True:
            key = chunk(run.data, run.attempt, run.rank, self.seq[stream])
            try:
                self.reg.put_if_absent(key, data, content_type, tags=dict([LOG_OBJECT_TAG]))
                self.seq[stream] += 1
                return
            except PreconditionFailed:
                self.seq[stream] += 1

    # ---- system metrics -----------------------------------------------------------------------------------
    def watch_system(self, sampler: SystemSampler, interval: float) -> None:
        """Sample now (the first sample of the node's run, whatever the loop's thread is doing), then every
        `interval` seconds (the spec's system_metrics_interval) in the loop."""
        self.system = sampler
        self.seq.setdefault("system", 0)
        try:
            self.sample_system()
        except Exception as exc:  # the job runs without its first sample rather than not at all
            log.warning("system metrics sample failed: %s", exc)
        self.every["system"], self.due["system"] = interval, self.clock.monotonic() + interval
        self._actions["system"] = self.sample_system

    def sample_system(self) -> None:
        """One sample into the buffer; a chunk of them goes up every SAMPLES_PER_CHUNK samples, so a node writes
        at most one chunk per interval, each a few KB."""
        if self.system is None:
            return
        self._samples.append(sysmetrics.encode(self.clock(), self.system.sample(self.clock.monotonic())))
        del self._samples[:-MAX_SYSTEM_BACKLOG]  # a bucket that refuses writes for long loses the oldest only
        if len(self._samples) >= sysmetrics.SAMPLES_PER_CHUNK:
            self.ship_system()

    def ship_system(self) -> None:
        """The samples not shipped yet, as one chunk (also at the end: nothing taken is left behind)."""
        if self._samples:
            taken = len(self._samples)
            self._put_chunk("system", b"".join(self._samples[:taken]))
            del self._samples[:taken]

    # ---- heartbeats and marks ---------------------------------------------------------------------------
    def heartbeat(self) -> None:
        run = self.run_info
        last = self.out.last_output_at
        utilization = self.gpu_utilization()
        beat = records.Heartbeat(time=self.clock(), instance_id=run.instance_id, rank=run.rank,
                                 attempt=run.attempt, phase=run.phase, last_output_at=last, gpu_util=utilization,
                                 step=self.out.step)
        self.reg.put_json(keys.heartbeat(run.job_id, run.attempt, run.rank), beat.body())
        meter = self.idle
        if meter is not None:  # after the heartbeat: the sweeper takes a mark as current when it is not older
            meter.add(self.clock.monotonic(), utilization if run.phase == "running" else None)
            mean = meter.idle(self.clock.monotonic())
            if mean is not None:
                self.reg.put_json(keys.idle_mark(run.job_id, run.attempt, run.rank),
                                  records.IdleMark(time=beat.time, mean_gpu_util=round(mean, 2), window=meter.window,
                                                   threshold=meter.threshold).body())
        seq = self.out.output_seq
        if seq != self._marked_output and last is not None:
            self.reg.put_json(keys.output_mark(run.job_id, run.attempt, run.rank),
                              records.OutputMark(time=last, step=self.out.step).body())
            self._marked_output = seq
