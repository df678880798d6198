"""The agent's side of a job's checkpoints and artifacts, and what it tells the job's log about them.

- At the start it restores the newest checkpoint and says which manifest, how old and how many files; on a
  later attempt that finds nothing, it warns when the attempt before ran longer than one sync period (its
  progress should have been there).
- While the job runs, a thread syncs the checkpoint directory (jobplane.agent.checkpoints) every sync period
  (the next one at once when one ran longer); a file whose newest version has not reached the bucket for two
  sync periods is named in the log, with the reason. A file the job rewrites in place goes up from a whole copy
  taken with the job's processes frozen for at most `copy_freeze` seconds (agent/copies.py).
- Whenever the agent is about to signal the job's processes (Spot notice, stop request, uptime cap, stall,
  or killing what is left), they are frozen (SIGSTOP) and `freeze` records which files they hold open for
  writing (every other process's a moment after the signal, which does not reach them), and their state: those
  may be half-written if the signal kills them, so while one is unchanged no sync takes it (`cut`), and the final
  sync and the artifacts upload leave it out, say so, and keep the
  previous complete version in force (or the newest whole copy); a training library's save holding such a file, or
  cut between two of its files, is left out whole (agent/saves.py). One the job went on writing after the signal
  (it survived SIGTERM) is judged anew. Once SIGKILL is due, or the job has ended, periodic syncs stop
  (`processes().running()`): the final sync takes over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jobplane.agent.checkpoints import SETTLE, CheckpointSync, age, publish
from jobplane.agent.clock import SYSTEM, Clock
from jobplane.agent.copies import Frozen, unfrozen
from jobplane.agent.layout import Layout
from jobplane.agent.process import UserProcess
from jobplane.agent.transfer import Moved, Stat, stat_of
from jobplane.agent.writers import under, writing
from jobplane.clouds.base import NotFound
from jobplane.model import keys, records
from jobplane.model.spec import JobSpec
from jobplane.store.rooted import RootedStore

log = logging.getLogger("jobplane.agent")
MID_WRITE = "open for writing when the job's processes were stopped, so it may be half-written"
COPY_FREEZE = 1.0  # seconds the job's processes may be frozen for a copy of the files it rewrites in place
COPY_WAIT = 10.0  # at most this long (and one sync interval) a sync waits for a save in progress to end, to copy it


@dataclass(frozen=True)
class Node:
    """Which job, attempt and rank this agent keeps checkpoints for."""

    job_id: str
    attempt: int
    rank: int
    owner: str | None = None  # the job's data folder's (keys.JobData): None for a job recorded before it had one

    @property
    def data(self) -> keys.JobData:
        return keys.JobData(self.job_id, self.owner)


class Keeper:
    def __init__(self, reg: RootedStore, layout: Layout, spec: JobSpec, node: Node, *, interval: float,
                 settle: float = SETTLE, say: Callable[[str], None], step: Callable[[], int | None],
                 clock: Clock = SYSTEM, processes: Callable[[], UserProcess | None] = lambda: None,
                 copy_freeze: float = COPY_FREEZE) -> None:
        self.reg, self.node, self.interval, self.say, self.clock = reg, node, interval, say, clock
        self.processes = processes  # the job's phase now running (or last run), if any
        self.copy_freeze = copy_freeze  # 0: never frozen, a copy is taken between two saves or not at all
        self.checkpoint_dir = layout.local(spec.checkpoint_dir)
        self.artifact_dirs = [layout.local(spec.artifacts_dir), layout.output_data_dir]
        store, prefix = reg.location(keys.checkpoints_prefix(node.data))
        self.sync = CheckpointSync(store, self.checkpoint_dir, prefix, rank=node.rank, attempt=node.attempt,
                                   settle=settle, clock=clock, say=say, step=step, overdue_after=2 * interval,
                                   sleep=clock.sleep, superseded=self._superseded, freezer=self._paused,
                                   freeze=copy_freeze, copy_every=interval, copy_wait=min(COPY_WAIT, interval),
                                   live=self._live, cut=self._cut)
        self.writing: dict[str, Stat | None] = {}  # each path open for writing at a signal the agent sent: its state
        self.froze = False  # the processes were frozen before a signal, and the kernel could tell what was open
        self._rest: list[threading.Thread] = []  # the scans of every other process, just after a signal
        self._settling = threading.Lock()  # the checkpoint thread and the main one both wait for them
        self.blind = False  # once, it could not

    def _superseded(self) -> bool:
        return moved_on(self.reg, self.node.job_id, self.node.attempt)

    def _paused(self, limit: float) -> AbstractContextManager[Frozen | None]:
        proc = self.processes()
        return unfrozen(limit) if proc is None or not self.copy_freeze else proc.paused(limit)

    def _live(self) -> bool:
        proc = self.processes()
        return proc is None or proc.running()

    # ---- the start ----------------------------------------------------------------------------------------
    def restore(self, retry: Callable[[str, Callable[[], Moved]], Moved]) -> Moved:
        restored = retry("restore checkpoints", self.sync.restore)
        if restored.files and self.sync.restored_from is not None:
            key, written = self.sync.restored_from
            old = f", {age((self.clock() - written).total_seconds())} old" if written else ""
            self.say(f"restored {restored.files} checkpoint files into {self.checkpoint_dir} (manifest"
                     f" {key.rsplit('/', 2)[-2]}/{key.rsplit('/', 1)[-1]}{old}: {restored.summary()})")
        elif self.node.attempt > 1:
            ran = self._previous_run()
            if ran is not None and ran > self.interval:
                self.say(f"no checkpoint to restore, although attempt {self.node.attempt - 1} ran for {age(ran)}"
                         f" (checkpoints are synced every {age(self.interval)}): its progress is lost; its log"
                         f" says why (`jobplane logs {self.node.job_id} --attempt {self.node.attempt - 1}`)")
        return restored

    def _previous_run(self) -> float | None:
        """Seconds the previous attempt's node of this rank ran: from its exit report, else from its cluster.json
        to its last heartbeat (a VM reclaimed before it could report)."""
        job, attempt, rank = self.node.job_id, self.node.attempt - 1, self.node.rank
        try:
            report = records.ExitReport.parse(self.reg.get_bytes(keys.exit_report(job, attempt, rank)))
            if report.started_at and report.ended_at:
                return (report.ended_at - report.started_at).total_seconds()
        except (NotFound, records.RecordError):
            pass
        started = [when for _, when, _ in self.reg.listing(keys.cluster(job, attempt))]
        beats = [when for key, when, _ in self.reg.listing(keys.heartbeat(job, attempt, rank))
                 if key == keys.heartbeat(job, attempt, rank)]
        return (beats[0] - started[0]).total_seconds() if started and beats else None

    # ---- while it runs ------------------------------------------------------------------------------------
    def periodic(self, stop: threading.Event) -> float:
        """One sync; returns the seconds until the next is due (none when this one took a whole period)."""
        started = self.clock.monotonic()
        moved = self.sync.sync(stop=stop)  # the final sync takes over on stop
        if moved.files:
            log.info("checkpoints: uploaded %s", moved.summary())
        return max(0.0, self.interval - (self.clock.monotonic() - started))

    def freeze(self) -> None:
        """The job's processes are stopped (SIGSTOP) just before a signal that may end them: what they hold open
        for writing now is what that signal can leave half-written. Only the processes the signal reaches are read
        before it; every other's files (a job's process that left the group) a moment after, off the path to the
        signal: the whole machine's /proc held a Trainer's SIGTERM back by half its stop (bench/stop_time.py)."""
        proc = self.processes()
        group = proc.members() if proc is not None else None
        found = self._record(writing(only=group) if group is not None else writing(), set())
        if group is not None:
            rest = threading.Thread(target=lambda: self._record(writing(but=group), found), name="freeze-rest",
                                    daemon=True)
            rest.start()
            self._rest.append(rest)

    def _record(self, paths: set[str] | None, before: set[str]) -> set[str]:
        """Paths open for writing, with their state now; none of `before` (the frozen processes' own, recorded
        at the freeze: a later state would hide what the signal cut)."""
        if paths is None:
            self.blind = True
            return set()
        self.froze = True
        self.writing |= {path: stat_of(Path(path)) for path in paths - before}
        return paths

    def _settled(self) -> None:
        """The scans of the processes outside the group are done."""
        with self._settling:
            while self._rest:
                self._rest.pop().join()

    def _cut(self, local: Path, rel: str, st: Stat) -> bool:
        """The file was open for writing at a signal and has not changed since: a signal may have cut its write."""
        self._settled()
        path = os.path.join(os.path.realpath(local), rel)
        return path in self.writing and self.writing[path] == st

    # ---- the end ------------------------------------------------------------------------------------------
    def torn_after(self, code: int | None, ended_ns: int | None) -> int | None:
        """Where the kernel could not tell what was open at the kill (or the process died by a signal the agent
        did not send): files written in place after this (ns) may be half-written."""
        self._settled()
        if ended_ns is None or code is None or code <= 128 or (self.froze and not self.blind):
            return None
        return ended_ns - int(self.sync.settle * 1e9)

    def left_out(self, directory: Path) -> dict[str, str]:
        """What may be half-written: open for writing at a signal and unchanged since."""
        self._settled()
        return {rel: MID_WRITE for rel in under(set(self.writing), directory)
                if (st := stat_of(directory / rel)) is not None and self._cut(directory, rel, st)}

    def final(self, notice: dict[str, str] | None, cut_ns: int | None) -> None:
        """Newest files first, and done before a Spot notice's termination time (see sync_budget)."""
        deadline = None
        if notice and notice.get("time"):
            try:
                at = datetime.fromisoformat(notice["time"].replace("Z", "+00:00"))
                # a deadline in the uploads' own time (time.monotonic, agent/checkpoints.py)
                deadline = time.monotonic() + sync_budget((at - self.clock()).total_seconds())
            except ValueError:
                pass
        moved = self.sync.sync(final=True, leave_out=self.left_out(self.checkpoint_dir), cut_ns=cut_ns,
                               deadline=deadline)
        if moved.files or moved.skipped or moved.failed:
            late = f"; {moved.skipped} not started before the notice deadline" if moved.skipped else ""
            self.say(f"final checkpoint sync: {moved.summary()}{late}")

    def artifacts(self, cut_ns: int | None) -> int:
        base = keys.artifacts_prefix(self.node.data) + ("" if self.node.rank == 0 else f"rank-{self.node.rank}/")
        n = 0
        for local, area in zip(self.artifact_dirs, ("model/", "output/"), strict=True):
            store, prefix = self.reg.location(base + area)
            leave_out = self.left_out(local)
            for rel, why in sorted(leave_out.items()):
                if (local / rel).is_file():
                    self.say(f"artifact {rel} left out: {why}")
            n += publish(store, local, prefix, leave_out=leave_out, cut_ns=cut_ns, sleep=self.clock.sleep).files
        return n


def moved_on(reg: RootedStore, job_id: str, attempt: int) -> bool:
    """The job has moved on to a later attempt, whose VMs may have restored this life's objects (a rerun's claim
    is written before its VMs boot). Where job.json cannot be read, assume so: keep everything, try later."""
    try:
        body = reg.get_json(keys.job_record(job_id))
    except NotFound:
        return False
    except Exception as exc:  # a blip: deleting can wait for the next sync
        log.warning("reading job.json before deleting old checkpoint objects: %s", exc)
        return True
    return isinstance(body, dict) and int(body.get("attempt") or 0) > attempt


FINAL_RESERVE = 10.0  # seconds of a Spot notice kept after the final checkpoint sync (logs, exit report)


def sync_budget(left: float) -> float:
    """Seconds the final checkpoint sync may start uploads in, when the VM goes away in `left` seconds: all
    but FINAL_RESERVE for the logs and the exit report, and never more than a quarter of what is left, so a
    notice that arrives late (or a short local grace) still leaves most of its time to the checkpoint."""
    return left - min(FINAL_RESERVE, max(left, 0.0) / 4)
