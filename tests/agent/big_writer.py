"""A training loop that rewrites one big checkpoint in place, a save taking longer than the pause between two,
and one attempt of it kept by the real Keeper and preempted the way the agent preempts it: for
tests/agent/test_big_checkpoints.py and bench/big_checkpoint.py.

The checkpoint carries its step at its head and at its tail (`step N` ... `end N`) and has a fixed length, so a
torn version (a save cut mid-write, or a copy that raced one) shows: its head and tail disagree, or it is short.
The loop appends `step began ended` (wall clock) to its log after each save is closed. Its training between two
saves is CPU time, which stops while its process is stopped, as a training step does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jobplane.agent.keeper import Keeper, Node
from jobplane.agent.layout import Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.process import Pause, UserProcess
from jobplane.agent.writers import open_for_writing
from jobplane.clouds.memory import MemoryStore
from jobplane.model.spec import JobSpec
from jobplane.store.registry import Registry

HEAD = 16  # bytes of `step N` at the head, and of `end N` at the tail

WRITER = """
import os, pathlib, random, signal, sys, time
path, size, log = pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
handler, save_s, pause_s = sys.argv[4] == "handler", float(sys.argv[5]), float(sys.argv[6])
stopping = False
if handler:  # the habit a signal handler allows: finish the step, save, exit
    def stop(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
step = int(path.read_bytes()[:16].split()[1]) if path.exists() else 0
CHUNK = 8 << 20

def train(seconds):  # compute: it makes no progress while the process is stopped, as a sleep would
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

block, chunks = b"w" * CHUNK, -(-size // CHUNK)
while True:
    step += 1
    began = time.time()
    with open(path, "wb") as f:  # torch.save(state, path): in place, never renamed
        f.write(f"step {step}".encode().ljust(16))
        left = size - 32
        while left:
            n = min(CHUNK, left)
            f.write(block[:n])
            left -= n
            time.sleep(save_s / chunks)  # serializing, copying tensors off the GPU
        f.write(f"end {step}".encode().ljust(16))
    with log.open("a") as out:
        out.write(f"{step} {began} {time.time()}\\n")
    if stopping:
        sys.exit(0)
    train(random.uniform(pause_s * 2 / 3, pause_s * 4 / 3))
"""


def version(path: Path, size: int) -> int | None:
    """The step of a whole checkpoint file; None if it is torn (head and tail disagree, or the length is not
    `size`)."""
    data = path.read_bytes()
    head, tail = data[:HEAD].split(), data[-HEAD:].split()
    if len(data) != size or len(head) != 2 or tail != [b"end", head[1]]:
        return None
    return int(head[1])


class Slow(MemoryStore):
    """Uploads of checkpoint files at `mb_per_s` (slower than saves, as a few GB to a bucket are); the copies on
    disk are counted at each one's start and end, and `since` is when the last one began (time.monotonic())."""

    def __init__(self, mb_per_s: float) -> None:
        super().__init__()
        self.mb_per_s, self.copies_on_disk, self.since = mb_per_s, list[int](), float("inf")

    def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
        if "/files/" in key:
            self.copies_on_disk.append(len(list(path.parent.iterdir())))
            self.since = time.monotonic()
            time.sleep(path.stat().st_size / 1e6 / self.mb_per_s)
            self.copies_on_disk.append(len(list(path.parent.iterdir())))
        return super().upload_file(key, path)


@dataclass(frozen=True)
class Save:
    step: int
    began: float
    ended: float


def saves(log: Path) -> list[Save]:
    """The saves the loop finished (a line cut by a kill is not one)."""
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) == 3:
            found.append(Save(int(parts[0]), float(parts[1]), float(parts[2])))
    return found


class Timed(UserProcess):
    """The job's process, noting how long each pause the keeper took for a copy kept it stopped."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.frozen: list[float] = []

    @contextlib.contextmanager
    def paused(self, limit: float) -> Iterator[Pause | None]:
        with super().paused(limit) as pause:
            yield pause
        if pause is not None:
            self.frozen.append(pause.seconds)


@dataclass
class Attempt:
    """What one attempt restored, saved and was preempted at."""

    number: int
    began: float  # wall clock, as the loop's log
    restored: int | None  # the step it restored, None if nothing (or torn: `whole` says)
    whole: bool
    saves: list[Save] = field(default_factory=list)
    frozen: list[float] = field(default_factory=list)  # seconds of each pause for a copy
    ran: float = 0.0  # seconds from the start to the preemption
    said: list[str] = field(default_factory=list)


@dataclass
class Job:
    """One job's attempts, each on a fresh disk, over one registry."""

    reg: Registry
    tmp: Path
    size: int
    interval: float
    save_s: float
    pause_s: float
    freeze: float = 1.0
    attempts: list[Attempt] = field(default_factory=list)
    spec: JobSpec = field(default_factory=lambda: JobSpec.model_validate(
        {"instance_type": "t3.micro", "run": "python3 train.py"}))

    def restore(self) -> tuple[Attempt, Keeper, list[UserProcess]]:
        """The next attempt's keeper, on a fresh disk, and what it restored."""
        n = len(self.attempts) + 1
        procs: list[UserProcess] = []
        said: list[str] = []
        keeper = Keeper(self.reg, Layout(self.tmp / f"attempt{n}"), self.spec, Node("big", n, 0),
                        interval=self.interval, say=said.append, step=lambda: None,
                        processes=lambda: procs[0] if procs else None, copy_freeze=self.freeze)
        keeper.restore(lambda what, fn: fn())
        keeper.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = keeper.checkpoint_dir / "checkpoint.pt"
        restored = version(path, self.size) if path.exists() else None
        attempt = Attempt(n, time.time(), restored, restored is not None or not path.exists(), said=said)
        self.attempts.append(attempt)
        return attempt, keeper, procs

    def run(self, *, ran: float, handler: bool, grace: float, keep: bool = True,
            until: Callable[[], bool] | None = None) -> Attempt:
        """An attempt: restore, train `ran` seconds with the keeper syncing every interval (then, given `until`,
        until it holds while a save is in progress), then what the agent does at a Spot notice (freeze, record
        what is open, SIGTERM, grace, SIGKILL) and the final sync. Without `keep`, no keeper syncs meanwhile (a
        baseline for what the keeper costs the job)."""
        attempt, keeper, procs = self.restore()
        n, path = attempt.number, keeper.checkpoint_dir / "checkpoint.pt"
        script, log = self.tmp / "train.py", self.tmp / f"saves{n}.log"
        script.write_text(WRITER)
        proc = Timed(f"exec {sys.executable} {script} {path} {self.size} {log} {'handler' if handler else 'none'}"
                     f" {self.save_s} {self.pause_s}", self.tmp, dict(os.environ), OutputLog(None))
        procs.append(proc)
        stop = threading.Event()

        def checkpointer() -> None:  # as the agent's checkpoint thread
            wait = self.interval
            while not stop.wait(wait):
                wait = keeper.periodic(stop)

        thread = threading.Thread(target=checkpointer, daemon=True)
        started = time.monotonic()
        try:
            if keep:
                thread.start()
            time.sleep(ran)  # the moment of the preemption
            end = time.monotonic() + 10
            while until is not None and time.monotonic() < end and not (
                    until() and "checkpoint.pt" in (open_for_writing(keeper.checkpoint_dir) or set())):
                time.sleep(0.01)
        finally:
            code = proc.terminate(grace, frozen=keeper.freeze)
            ended_ns = time.time_ns()
            stop.set()
            if keep:
                thread.join()
            attempt.ran = time.monotonic() - started
            keeper.final(None, keeper.torn_after(code, ended_ns))
        attempt.saves, attempt.frozen = saves(log), proc.frozen
        return attempt

    def lag(self, attempt: Attempt) -> float | None:
        """Seconds between the last save the attempt before finished and the one this attempt restored (its
        end; the attempt before's start if it restored what that one began from); None without one before."""
        if attempt.number == 1:
            return None
        before = self.attempts[attempt.number - 2]
        if not before.saves:
            return 0.0
        if attempt.restored == before.restored:
            return before.saves[-1].ended - before.began
        if (attempt.restored or 0) > before.saves[-1].step:  # whole, and closed just before the kill cut its log line
            return 0.0
        ended = {save.step: save.ended for save in before.saves}
        return before.saves[-1].ended - ended.get(attempt.restored or 0, float("-inf"))

    def cycle(self, attempt: Attempt) -> float:
        """The longest save cycle (one save's end to the next's) of the attempt, or its save time if it finished
        one save only."""
        ends = [save.ended for save in attempt.saves]
        gaps = [b - a for a, b in itertools.pairwise(ends)]
        return max(gaps, default=max((s.ended - s.began for s in attempt.saves), default=0.0))
