"""A training library's saves through preemptions (issue 43): four libraries' habits (tests/agent/library_writer.py:
the Hugging Face Trainer, DeepSpeed, torch.distributed.checkpoint in torchtitan's layout, PyTorch Lightning), each
saving and rotating as the library does, kept by the real Keeper over a narrow link (uploads one at a time, so a
save is often deleted by the job's rotation while it goes up), and preempted the way the agent preempts (freeze,
SIGTERM, grace, SIGKILL, final sync) at seeded random moments, half of them in the middle of a save, with and
without a SIGTERM handler. Every next attempt resumes by the library's own rule from a whole save no older than
one save cycle plus one sync interval than the last one the attempt before finished, and no line says a rotated
file failed."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jobplane.agent.keeper import Keeper, Node
from jobplane.agent.layout import Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.clouds.memory import MemoryStore
from jobplane.model.spec import JobSpec
from jobplane.store.registry import Registry
from tests.agent.library_writer import RESUME, WRITER

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")]
INTERVAL = 0.3  # seconds between two syncs
JITTER = 0.5  # seconds a sync may start late on a loaded machine


class Narrow(MemoryStore):
    """Checkpoint uploads one at a time, each taking `seconds`; counts those whose file the job deleted first."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.link, self.vanished = seconds, threading.Lock(), 0

    def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
        if "/files/" not in key:
            return super().upload_file(key, path)
        with self.link:
            time.sleep(self.seconds)
            try:
                return super().upload_file(key, path)
            except FileNotFoundError:
                self.vanished += 1
                raise


def saving(pid: int, directory: Path) -> bool:
    """The writer holds a file in the directory open now: one look at its own descriptors, so the preemption that
    follows comes within a millisecond or two (a look at every process on a busy machine took longer than a save)."""
    inside = str(directory.resolve()) + os.sep
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
    return False


@dataclass
class Attempt:
    number: int
    restored: int | None  # the step the library's resume rule found
    saves: dict[int, float] = field(default_factory=dict)  # step -> when that save (and its rotation) ended
    said: list[str] = field(default_factory=list)


@dataclass
class Job:
    """One job of a library's habit: its attempts, each on a fresh disk, over one registry."""

    habit: str
    store: Narrow
    tmp: Path
    attempts: list[Attempt] = field(default_factory=list)

    def restore(self) -> tuple[Attempt, Keeper, list[UserProcess]]:
        n, procs, said = len(self.attempts) + 1, list[UserProcess](), list[str]()
        spec = JobSpec.model_validate({"instance_type": "t3.micro", "run": "python3 train.py"})
        keeper = Keeper(Registry(self.store), Layout(self.tmp / f"attempt{n}"), spec, Node(self.habit, n, 0),
                        interval=INTERVAL, say=said.append, step=lambda: None,
                        processes=lambda: procs[0] if procs else None)
        keeper.restore(lambda what, fn: fn())
        keeper.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        attempt = Attempt(n, RESUME[self.habit](keeper.checkpoint_dir), said=said)  # raises if it is not whole
        self.attempts.append(attempt)
        return attempt, keeper, procs

    def run(self, *, ran: float, handler: bool, grace: float, mid_save: bool) -> None:
        """An attempt: resume, train `ran` seconds (then, given mid_save, until a save is in progress) with the keeper
        syncing every interval, then the agent's preemption and the final sync."""
        attempt, keeper, procs = self.restore()
        script, log = self.tmp / "train.py", self.tmp / f"saves{attempt.number}.log"
        script.write_text(WRITER)
        procs.append(UserProcess(
            f"exec {sys.executable} {script} {self.habit} {keeper.checkpoint_dir} {log}"
            f" {'handler' if handler else 'none'} {attempt.restored or 0}", self.tmp, dict(os.environ),
            OutputLog(None)))
        stop = threading.Event()

        def checkpointer() -> None:  # as the agent's checkpoint thread
            wait = INTERVAL
            while not stop.wait(wait):
                wait = keeper.periodic(stop)

        thread = threading.Thread(target=checkpointer, daemon=True)
        try:
            thread.start()
            time.sleep(ran)
            end = time.monotonic() + 5
            while mid_save and time.monotonic() < end and not saving(procs[0].pid, keeper.checkpoint_dir):
                time.sleep(0.002)
        finally:
            code = procs[0].terminate(grace, frozen=keeper.freeze)
            ended_ns = time.time_ns()
            stop.set()
            thread.join()
            keeper.final(None, keeper.torn_after(code, ended_ns))
        for line in log.read_text().splitlines() if log.exists() else []:
            if len(parts := line.split()) == 3:
                attempt.saves[int(parts[0])] = float(parts[2])

    def check(self) -> None:
        """Each attempt after the first resumed within one save cycle plus one interval of the last save finished
        before its preemption (by the save's end, wall clock)."""
        ended = {step: when for attempt in self.attempts for step, when in attempt.saves.items()}
        for before, attempt in itertools.pairwise(self.attempts):
            if not before.saves:
                assert (attempt.restored or 0) >= (before.restored or 0), (before, attempt)
                continue
            last = max(before.saves)
            if (attempt.restored or 0) >= last:
                continue
            ends = sorted(before.saves.values())
            cycle = max((b - a for a, b in itertools.pairwise(ends)), default=0.5)
            lag = before.saves[last] - ended.get(attempt.restored or 0, float("-inf"))
            assert lag <= cycle + INTERVAL + JITTER, (
                f"attempt {attempt.number} resumed from step {attempt.restored}, {lag:.2f} s before the last save of"
                f" attempt {before.number} (step {last}; bound {cycle + INTERVAL:.2f} s): {before}")


@pytest.mark.parametrize("habit", ["trainer", "deepspeed", "dcp", "lightning"])
def test_a_library_preempted_at_random_resumes_from_a_whole_recent_save(
        tmp_path: Path, habit: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jobplane.agent")
    rng = random.Random(43)
    job = Job(habit, Narrow(0.05), tmp_path)
    for n in range(4):
        job.run(ran=rng.uniform(0.3, 0.8), handler=n % 2 == 1, grace=rng.choice([0.05, 0.5]), mid_save=n % 2 == 0)
    job.restore()  # the last preemption's resume: the library's rule raises if what it finds is not whole
    job.check()
    assert sum(len(attempt.saves) for attempt in job.attempts) >= 4, "the job trained"
    assert any(" left out: " in line for attempt in job.attempts for line in attempt.said), "\n".join(
        line for attempt in job.attempts for line in attempt.said)
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    failed += [line for attempt in job.attempts for line in attempt.said if "failed" in line]
    assert not failed, failed  # test_saves.py rotates a save during its upload every time; here it comes by chance
