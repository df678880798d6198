"""A job, as a handle: its state, waiting for it, its output, metrics, cost, artifacts, and cancelling it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from jobplane.clouds.base import AccessDenied, Instance, NotFound
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.metrics import Sample
from jobplane.model.states import State
from jobplane.ops import cancels, jobs
from jobplane.sdk import shell
from jobplane.sdk.connection import Connection
from jobplane.sdk.errors import Refused, translated
from jobplane.views import cost, metricview, sysview
from jobplane.views.jobview import JobView, Status

Goal = Literal["terminal", "running"]
Area = Literal["checkpoints", "artifacts"]
StatusCallback = Callable[[Status], None]


class LogLine(str):
    """One line of a job's output (without its line break), with the attempt and rank that printed it. It is a
    str: print it, search it, compare it."""

    attempt: int
    rank: int

    def __new__(cls, text: str, attempt: int, rank: int) -> LogLine:
        line = super().__new__(cls, text)
        line.attempt, line.rank = attempt, rank
        return line


def _lines(chunk: jobs.Chunk) -> Iterator[LogLine]:
    """The chunk's lines, split at line feeds only (a carriage return stays in its line, as a terminal shows it).
    A chunk's last line may lack its line feed: the agent cuts its output into chunks by time and size."""
    text = chunk.text.removesuffix("\n")
    if text or chunk.text:
        for line in text.split("\n"):
            yield LogLine(line, chunk.attempt, chunk.rank)


@dataclass(frozen=True)
class Metric:
    """One training metric as one rank printed it, attempt after attempt: the job's spec's `metrics`, else
    loss, accuracy, learning_rate and step as the output printed them."""

    series: metricview.Series

    @property
    def name(self) -> str:
        """The metric's name: loss, or the name its definition in the spec gives."""
        return self.series.name

    @property
    def rank(self) -> int:
        """The rank whose points these are: the one asked for, else the lowest that printed the metric."""
        return self.series.rank

    @property
    def points(self) -> list[Sample]:
        """Every point in the order printed: `.value`, `.step` (None before the output showed one),
        `.attempt`, `.time` (when the agent read it)."""
        return list(self.series.samples)

    @property
    def values(self) -> list[float]:
        """Every value in the order printed, attempt after attempt."""
        return self.series.values()

    @property
    def last(self) -> float:
        """The newest value (NaN or Inf included: a divergence is not hidden)."""
        return self.series.last.value

    @property
    def min(self) -> float | None:
        """The smallest finite value; None if every value was NaN or Inf."""
        return min(self.series.finite, default=None)

    @property
    def max(self) -> float | None:
        """The largest finite value; None if every value was NaN or Inf."""
        return max(self.series.finite, default=None)

    def __repr__(self) -> str:
        last = self.last if math.isfinite(self.last) else str(self.last)
        return f"Metric({self.name!r}, last={last}, min={self.min}, max={self.max}, points={len(self.series.samples)})"


@dataclass(frozen=True)
class Stored:
    """What the bucket holds under one of a job's areas (checkpoints/ or artifacts/), as listed: `files`, the
    first objects by key, each (path under the area, size in bytes); `count` and `size`, of every object."""

    files: list[tuple[str, int]]
    count: int
    size: int


@dataclass(frozen=True)
class Lifetime:
    """How long a job may live, under the deployment's policy as it is now: `attempts` so far, of at most
    `max_attempts` (its first, max_restarts reruns and retry.max retries, within the policy's
    `max_attempts_per_job`); no attempt starts after `last_start` (submission + `max_wait`; None until the launcher
    has recorded the job), and each runs at most `max_runtime` seconds, so the job is over by `ends_by`."""

    attempts: int
    max_attempts: int
    max_attempts_per_job: int
    max_wait: int
    max_runtime: int
    last_start: datetime | None
    ends_by: datetime | None


class Job:
    """A job in the registry, by id. `view` is what was read last (refresh() reads it again); `state` reads it
    again each time; every other method reads what it returns from the registry when called.

    Jobs come from Client.submit, Client.get and Client.list; a Job may be used from several threads.
    """

    __slots__ = ("_connection", "_view")  # a look makes one per job: 10,000 on a dashboard's every view

    def __init__(self, connection: Connection, view: JobView) -> None:
        self._connection, self._view = connection, view

    @property
    def id(self) -> str:
        """The job's id: its name, the time it was submitted and 4 hex digits, unless one was given."""
        return self._view.id

    @property
    def view(self) -> JobView:
        """The job as last read: `state`, `since`, `spec`, `record` (None until the launcher has taken the
        drop), `reason`, `attempt`, `num_nodes`, `terminal`."""
        return self._view

    @property
    def state(self) -> State:
        """The job's state now (reads the registry): QUEUED, LAUNCHING, RUNNING, ..., SUCCEEDED, FAILED."""
        return self.refresh()._view.state

    @property
    def reason(self) -> str | None:
        """Why the job is in its state, as last read (the reason of an ending, a capacity wait, a rejection)."""
        return self._view.reason

    @property
    def owner(self) -> str:
        """Whose job it is, as last read: its record's owner, else its spec's, else "default" (a drop straight
        under queue/ whose spec the launcher will reject)."""
        return self._view.owner

    @property
    def held_until(self) -> datetime | None:
        """Until when a FAILED attempt's VMs are kept for a look (the spec's `debug_hold`), as last read; None
        without a hold. `jobplane ssh` reaches them until then."""
        record = self._view.record
        return record.held_until if record else None

    @property
    def data(self) -> keys.JobData:
        """Where its logs, metrics, checkpoints and artifacts are: its record's say (read once when the last look had
        none); a job not recorded yet will keep them under its owner's teams/<owner>/<id>/."""
        if self._view.record is None:
            self.refresh()
        record = self._view.record
        return record.data if record is not None else keys.JobData(self.id, self.owner)

    def refresh(self) -> Job:
        """Read the job again (its record, else its drop in queue/, else its rejection); returns the job."""
        with translated(self.id, self.owner):
            self._view = jobs.find(self._connection.registry, self.id)
        return self

    def wait(self, timeout: float | None = None, for_: Goal = "terminal", *, interval: float = 2.0,
             on_status: StatusCallback | None = None) -> State:
        """Wait until the job ends (for_="terminal") or runs (for_="running": RUNNING, or already ended) and
        return its state then; a job that ends without succeeding is returned, not raised.

        Timeout (the job goes on) if `timeout` seconds pass first. on_status is told where the job is at each
        poll (`.text`: "queued 3s: waiting for the launcher", "running attempt 1 on i-0abc"), every `interval`
        seconds, until it reaches the goal.
        """
        how = jobs.Follow(on_status=on_status or _ignore, interval=interval, timeout=timeout)
        with translated(self.id, self.owner):
            self._view = jobs.follow(self._connection.registry, self.id, jobs.Goal(for_), how)
        return self._view.state

    def logs(self, follow: bool = False, *, attempt: int | None = None, rank: int | None = None,
             interval: float = 1.0, timeout: float | None = None,
             on_status: StatusCallback | None = None) -> Iterator[LogLine]:
        """The job's output, line by line, in (attempt, rank, order printed) order; optionally only one attempt
        and/or rank. Each line knows its `.attempt` and `.rank`.

        Without follow, the lines uploaded so far. With follow, the lines as they come until the job ends and its
        agents' last output is in (a queued job is waited for), polling every `interval` seconds and telling
        on_status where the job is; Timeout past `timeout` seconds. Stopping the iteration never stops the job.

        The agent uploads output by time and size, so a line still being printed when a piece went up comes in
        two parts (as `jobplane logs` prints it); a carriage return stays inside its line.
        """
        with translated(self.id, self.owner):
            reader = jobs.LogReader(self._connection.registry, self.data, attempt, rank)
        if not follow:
            with translated(self.id, self.owner):
                chunks = reader.new()
            for chunk in chunks:
                yield from _lines(chunk)
            return
        how = jobs.Follow(on_status=on_status or _ignore, logs=reader, compute=self._connection.compute,
                          interval=interval, timeout=timeout)
        with translated(self.id, self.owner):
            steps = jobs.following(self._connection.registry, self.id, jobs.Goal.TERMINAL, how)
            while True:
                try:
                    chunk = next(steps)
                except StopIteration as done:
                    self._view = done.value
                    return
                yield from _lines(chunk)

    def metrics(self, *, attempt: int | None = None, rank: int | None = None,
                system: bool = False) -> dict[str, Metric]:
        """Each metric by name, in the order first printed: `.points`, `.last`, `.min`, `.max`. Each comes from
        `rank` if given, else from the lowest rank that printed it; optionally only one attempt.

        With system=True, the machine's figures the agents sampled instead (cpu_percent, memory_used_gb,
        disk_used_gb, net_in_mb_s, net_out_mb_s, gpu0.utilization, gpu0.memory_used_gb, gpu0.power_w, ...),
        every rank's: named `system/<figure>`, with ` [rank N]` after it for a rank other than 0."""
        registry = self._connection.registry
        with translated(self.id, self.owner):
            if system:
                return {f"system/{sysview.label(s)}": Metric(s)
                        for s in sysview.series(jobs.read_system(registry, self.data, attempt, rank))}
            samples = jobs.read_metrics(registry, self.data, attempt, rank)
        return {s.name: Metric(s) for s in metricview.series(samples, rank)}

    def right_sizing(self) -> str | None:
        """Once the job has ended, what its GPUs' system metrics say of its instance, e.g. "GPU utilization
        averaged 18%, memory 9 of 24 GB: a smaller instance may do"; None while it runs, when its GPUs were
        busy, or without GPU samples."""
        if not self.view.terminal:
            return None
        with translated(self.id, self.owner):
            return sysview.hint(jobs.read_system(self._connection.registry, self.data))

    def cost(self, now: datetime | None = None) -> cost.Cost:
        """The estimated cost so far (reads the record again): `.usd`, `.instance_hours`, `.unpriced` (attempts
        whose hourly price is unknown), `.running` (still growing). Instance time at the hourly price recorded
        at launch; disks, addresses and transfer are not included. Zero before the job launched anything."""
        record = self.refresh()._view.record
        return cost.job_cost(record, now or utcnow()) if record else cost.Cost()

    def cancel(self, force: bool = False) -> cancels.Cancelled:
        """Cancel the job: it is marked CANCELLED and its agents are asked to stop (they checkpoint, sync and
        power off); a job that has not started never runs. force also terminates its VMs at once.

        Returns `.record` (CANCELLED), `.before_launch`, `.terminated` (the VMs terminated now). Refused if the
        job has already ended. A team member, whose credentials may not write a job's record, asks the functions
        (`.requested`): they cancel a job of its own team only (NotYours for another team's), and the call waits
        for the job to end (a minute at most; `.record` is the job as last read)."""
        registry = self._connection.registry
        with translated(self.id, self.owner):
            try:
                done = cancels.cancel(registry, self.id, force=force, compute=self._connection.compute)
            except AccessDenied:  # not the platform team: ask the functions
                done = cancels.request(registry, self.id, force=force)
        self._view = JobView.of(done.record)
        return done

    def artifacts(self) -> list[jobs.Artifact]:
        """The files the job's agents uploaded when its process ended, by `.path`: `model/...` (SM_MODEL_DIR),
        `output/...` (output/data), a rank other than 0's under `rank-<n>/`; with `.size`."""
        with translated(self.id, self.owner):
            return jobs.artifacts(self._connection.registry, self.data)

    def download(self, dest: str | Path = ".", *, prefix: str = "") -> list[Path]:
        """Download the job's artifacts (those whose path starts with `prefix`, e.g. "model/") to `dest/<path>`;
        returns the files written."""
        with translated(self.id, self.owner):
            wanted = [a for a in jobs.artifacts(self._connection.registry, self.data) if a.path.startswith(prefix)]
            return jobs.download(self._connection.registry, wanted, Path(dest))

    def events(self) -> list[dict[str, object]]:
        """The job's history, oldest first: each transition (`kind`, `time`, its detail) and each stop request,
        termination and safety refusal the functions recorded."""
        with translated(self.id, self.owner):
            return self._connection.registry.events(self.id)

    def instances(self) -> list[Instance]:
        """The job's VMs the cloud lists now (every attempt's, in every state but gone)."""
        with translated(self.id, self.owner):
            return [i for i in self._connection.compute().list_managed() if i.job_id == self.id]

    def shell_target(self, rank: int = 0) -> str:
        """The instance `jobplane ssh` enters for `rank`: of a live job's current attempt, or of a FAILED one's
        its `debug_hold` keeps. Refused if the deployment's policy has `access.ssh` off, or there is no such VM."""
        with translated(self.id, self.owner):
            if not self._connection.registry.policy().access.ssh:
                raise Refused("ssh is off in this deployment's policy: set `access: {ssh: true}` in "
                              "config/policy.yaml (and let the VMs in: jobplane:ssh on AWS, ssh_via_iap on GCP)")
            record = self.refresh()._view.record
            if record is None:
                raise Refused(f"job {self.id} is {self._view.state}: no VM yet")
            try:
                return shell.target(record, rank, utcnow())
            except shell.ShellError as exc:
                raise Refused(str(exc)) from None

    def stored(self, area: Area, limit: int = 200) -> Stored:
        """The objects under the job's checkpoints/ or artifacts/ as the bucket lists them (files, manifests,
        every rank's and attempt's), whatever their state: the first `limit` by key, and the count and size of
        all. artifacts() is what the agents finished uploading."""
        files: list[tuple[str, int]] = []
        count = total = 0
        with translated(self.id, self.owner):
            prefix = {"checkpoints": keys.checkpoints_prefix, "artifacts": keys.artifacts_prefix}[area](self.data)
            for key, _, size in self._connection.registry.listing(prefix):
                count += 1
                total += size
                if len(files) < limit:
                    files.append((key.removeprefix(prefix), size))
        return Stored(files, count, total)

    def fetch(self, area: Area, path: str, dest: str | Path) -> Path:
        """Download one object of the job's checkpoints/ or artifacts/, by its path there as stored() lists it, to
        the file `dest` (streamed in parts, whatever its size); returns dest. Refused for a path that is not one
        object of that area: no `..`, empty or absolute part reaches past the job's own data."""
        parts = path.split("/")
        if not path or "\\" in path or any(p in ("", ".", "..") for p in parts) or not path.isprintable():
            raise Refused(f"{path!r} is not a path under the job's {area}/")
        with translated(self.id, self.owner):
            prefix = {"checkpoints": keys.checkpoints_prefix, "artifacts": keys.artifacts_prefix}[area](self.data)
            key = prefix + path
            # the listing says it is one object (not a folder of several) and its size, so the download asks no more
            size = next((size for found, _, size in self._connection.registry.listing(key, page_size=1)
                         if found == key), None)
            if size is None:
                raise Refused(f"job {self.id} has no {area}/{path}")
            store, full = self._connection.registry.location(key)
            try:
                store.download_file(full, Path(dest), size=size)
            except NotFound:
                raise Refused(f"{area}/{path} of job {self.id} was deleted since it was listed") from None
        return Path(dest)

    def lifetime(self) -> Lifetime:
        """Its bounds as the policy has them now (reads the policy): attempts so far and at most, the last time an
        attempt may start, how long each may run. A job not yet recorded is measured from its spec."""
        with translated(self.id, self.owner):
            policy = self._connection.registry.policy()
        view = self._view
        record = view.record
        spec = record.spec if record is not None else view.spec
        if spec is None:
            raise Refused(f"job {self.id} was rejected: it has no spec to measure")
        max_wait, max_runtime = policy.max_wait(spec), policy.max_runtime(spec)
        last = record.created_at + timedelta(seconds=max_wait) if record is not None else None
        return Lifetime(attempts=record.attempt if record is not None else 0, max_attempts=policy.max_attempts(spec),
                        max_attempts_per_job=policy.max_attempts_per_job, max_wait=max_wait, max_runtime=max_runtime,
                        last_start=last, ends_by=last + timedelta(seconds=max_runtime) if last else None)

    def checkpoint(self) -> jobs.Checkpoint | None:
        """The newest checkpoint in the bucket (what a next attempt would restore), or None."""
        with translated(self.id, self.owner):
            return jobs.newest_checkpoint(self._connection.registry, self.data)

    def __repr__(self) -> str:
        return f"<Job {self.id} {self._view.state}>"


def _ignore(status: Status) -> None:
    pass
