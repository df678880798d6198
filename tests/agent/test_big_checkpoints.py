"""Big checkpoints saved in place more often than they can be copied between two saves (issue 37's GPU run,
without a GPU): a file of a few hundred MB rewritten in place, each save longer than the pause after it, the real
Keeper syncing it, and the agent's own preemption (freeze, SIGTERM, grace, SIGKILL, final sync) at random
moments, with and without a SIGTERM handler, on a machine kept busy. Every next attempt restores a whole file
(its head and tail agree, its length is right) whose step is within one save cycle plus one sync interval of the
last save the attempt before finished."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.store.registry import Registry
from tests.agent.big_writer import Attempt, Job, Slow

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")]
JITTER = 0.5  # seconds a sync may start late on a loaded machine


@pytest.fixture
def busy() -> Iterator[None]:
    """A busy loop per core, at nice 10: the machine is never idle, while the tests beside this one in `make test`
    lose about a tenth of a core to them."""
    loops = [subprocess.Popen([sys.executable, "-c", "import os\nos.nice(10)\nwhile True: pass"])
             for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def restored_whole_and_recent(job: Job, attempt: Attempt) -> None:
    before = job.attempts[attempt.number - 2]
    assert attempt.whole, f"attempt {attempt.number} restored a torn checkpoint; attempt {before.number}: {before}"
    lag, bound = job.lag(attempt), job.cycle(before) + job.interval
    assert lag is not None and lag <= bound + JITTER, (
        f"attempt {attempt.number} restored step {attempt.restored}, {lag:.2f} s older than the last save attempt"
        f" {before.number} finished (one cycle and one interval: {bound:.2f} s): {before}")


def test_a_big_checkpoint_saved_in_place_and_preempted_at_random_restores_whole_and_recent(
        tmp_path: Path, busy: None) -> None:
    rng = random.Random(37)
    job = Job(Registry(Slow(mb_per_s=300)), tmp_path, size=300 << 20, interval=2.0, save_s=0.6, pause_s=0.15)
    for n in range(5):  # a handler's grace may end before its last save does: SIGKILL cuts that one
        job.run(ran=rng.uniform(2.5, 4.5), handler=n % 2 == 1, grace=rng.choice([0.3, 3.0]))
    job.restore()
    for attempt in job.attempts[1:]:
        restored_whole_and_recent(job, attempt)
    assert sum(len(attempt.saves) for attempt in job.attempts) >= len(job.attempts), "the job trained"
    frozen = [f for attempt in job.attempts for f in attempt.frozen]
    assert frozen and max(frozen) <= job.freeze + JITTER, frozen  # the watchdog's bound
    left_out = [line for attempt in job.attempts for line in attempt.said if " left out: " in line]
    assert all(line.endswith((" stays", "no earlier version of it is in the bucket")) for line in left_out), left_out
    assert not list(tmp_path.glob("attempt*/.checkpoints.staging/*")), "every copy is removed at the end"


def test_uploads_slower_than_the_interval_still_leave_a_recent_whole_copy_for_the_final_sync(
        tmp_path: Path) -> None:
    store = Slow(mb_per_s=22)  # 1.5 s for the 32 MB
    job = Job(Registry(store), tmp_path, size=32 << 20, interval=0.5, save_s=0.15, pause_s=0.15)
    # preempted a second into an upload, with a save in progress: the upload's copy is a second old or more
    first = job.run(ran=2.0, handler=False, grace=0.1, until=lambda: time.monotonic() - store.since > 1.0)
    job.restore()
    restored_whole_and_recent(job, job.attempts[1])
    assert any("was being written when the job's processes were stopped: its newest whole copy" in line
               for line in first.said), first.said
    assert max(store.copies_on_disk) <= 2, store.copies_on_disk  # the one uploaded, and the newest
