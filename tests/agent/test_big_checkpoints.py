"""Big checkpoints saved in place more often than they can be copied between two saves (issue 37's GPU run,
without a GPU): a file of a few hundred MB rewritten in place, each save longer than the pause after it, the real
Keeper syncing it, and the agent's own preemption (freeze, SIGTERM, grace, SIGKILL, final sync) at random
moments, with and without a SIGTERM handler, on a core kept busy. Every next attempt restores a whole file
(its head and tail agree, its length is right) whose step is within one save cycle plus one sync interval of the
last save the attempt before finished. Then the paths that once kept a torn save, each driven step by step, and
the pause a copy takes: bounded, thawed, never beside a stop."""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.agent.keeper import Keeper, Node
from jobplane.agent.layout import Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.clouds.memory import MemoryStore
from jobplane.model.spec import JobSpec
from jobplane.store.registry import Registry
from tests.agent.big_writer import Attempt, Job, Slow, version
from tests.agent.test_checkpoint_writers import members
from tests.agent.test_checkpoints import PREFIX
from tests.helpers import in_tmpfs, wait_for

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")]
JITTER = 0.5  # seconds a sync may start late on a loaded machine


@pytest.fixture
def busy() -> Iterator[None]:
    """The test's core never idle: the test and every process it starts (threads and children inherit it) are held
    to one core, where a busy loop at nice 19 runs, so a process that wakes waits for the core to be taken from the
    loop; the tests beside this one in `make test` lose almost nothing to it (at nice 10 they lost about a tenth of
    a core while it ran). One loop on one core is the busy machine a loop per core made, for half the CPU seconds
    or less: those loops took every idle moment of every core."""
    allowed = os.sched_getaffinity(0)  # this thread's: the test runs in it, and what it starts inherits it
    core = {max(allowed)}
    loop = subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
    try:
        os.sched_setaffinity(loop.pid, core)
        os.sched_setaffinity(0, core)
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        loop.kill()
        loop.wait()


@pytest.fixture
def in_memory(tmp_path: Path) -> Iterator[Path]:
    """A directory in tmpfs where there is one: the test writes some 10 GB of checkpoints and copies, which on disk
    would throttle every other test's writes while the kernel writes them back."""
    with in_tmpfs("big-checkpoints-", tmp_path) as where:
        yield where


def restored_whole_and_recent(job: Job, attempt: Attempt) -> None:
    before = job.attempts[attempt.number - 2]
    assert attempt.whole, f"attempt {attempt.number} restored a torn checkpoint; attempt {before.number}: {before}"
    lag, bound = job.lag(attempt), job.cycle(before) + job.interval
    assert lag is not None and lag <= bound + JITTER, (
        f"attempt {attempt.number} restored step {attempt.restored}, {lag:.2f} s older than the last save attempt"
        f" {before.number} finished (one cycle and one interval: {bound:.2f} s): {before}")


def test_a_big_checkpoint_saved_in_place_and_preempted_at_random_restores_whole_and_recent(
        in_memory: Path, busy: None) -> None:
    rng = random.Random(37)
    job = Job(Registry(Slow(mb_per_s=300)), in_memory, size=300 << 20, interval=2.0, save_s=0.6, pause_s=0.15)
    # each way a stop meets the job once (four attempts; five random ones never gave a handler the long grace): no
    # handler (SIGTERM ends it), a handler whose grace ends before its last save does (SIGKILL cuts that one), and a
    # handler given the time to finish its save
    for handler, grace in ((False, 0.3), (True, 0.3), (False, 3.0), (True, 3.0)):
        job.run(ran=rng.uniform(2.5, 4.5), handler=handler, grace=grace)
    job.restore()
    for attempt in job.attempts[1:]:
        restored_whole_and_recent(job, attempt)
    assert sum(len(attempt.saves) for attempt in job.attempts) >= len(job.attempts), "the job trained"
    frozen = [f for attempt in job.attempts for f in attempt.frozen]
    assert frozen and max(frozen) <= job.freeze + JITTER, frozen  # the watchdog's bound
    left_out = [line for attempt in job.attempts for line in attempt.said if " left out: " in line]
    assert all(line.endswith((" stays", "no earlier version of it is in the bucket")) for line in left_out), left_out
    assert not list(in_memory.glob("attempt*/.checkpoints.staging/*")), "every copy is removed at the end"


def test_uploads_slower_than_the_interval_still_leave_a_recent_whole_copy_for_the_final_sync(
        in_memory: Path) -> None:
    mid_write = "was being written when the job's processes were stopped: its newest whole copy"
    said: list[str] = []
    for tries in range(3):
        # preempted a second into an upload, with a save in progress and a whole copy newer than the upload's; the
        # save may close between seeing it open and the freeze (a loaded machine): then nothing was cut, which the
        # final sync says, and the race is run again on a fresh job
        disk = in_memory / f"try{tries}"
        disk.mkdir()
        store = Slow(mb_per_s=22)  # 1.5 s for the 32 MB
        job = Job(Registry(store), disk, size=32 << 20, interval=0.5, save_s=0.15, pause_s=0.15)

        def a_copy_newer_than_the_upload(store: Slow = store, disk: Path = disk) -> bool:  # the copy uploaded, a newer
            return time.monotonic() - store.since > 1.0 and len(list(disk.glob("attempt1/.*.staging/*"))) >= 2

        first = job.run(ran=2.0, handler=False, grace=0.1, until=a_copy_newer_than_the_upload)
        job.restore()
        restored_whole_and_recent(job, job.attempts[1])  # raced or not
        # the one uploaded and the newest, and a newer one if an upload began or ended while it was being taken
        assert max(store.copies_on_disk) <= 3, store.copies_on_disk
        said = first.said
        if any(mid_write in line for line in said):
            return
    if os.getloadavg()[0] > (os.cpu_count() or 1):  # a loaded machine: the race may not happen, which is no fault
        pytest.skip(f"no preemption in 3 landed while a save was being written (load {os.getloadavg()[0]:.1f}): "
                    f"the race went unexercised; every restore was whole and recent: {said}")
    raise AssertionError(f"no preemption in 3 landed while a save was being written: {said}")


# saves step N in place when the test writes flags/save-N (its content "half": stops midway until killed)
STEPPED = """
import pathlib, sys, time
path, size, flags = pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
step = 0
while True:
    step += 1
    while not (flags / f"save-{step}").exists():
        time.sleep(0.01)
    half = (flags / f"save-{step}").read_text() == "half"
    with open(path, "wb") as f:  # torch.save's way: in place
        f.write(f"step {step}".encode().ljust(16))
        f.write(b"w" * (size // 2 - 16))
        if half:
            f.flush()
            (flags / f"half-{step}").touch()
            time.sleep(3600)
        f.write(b"w" * (size - size // 2 - 16))
        f.write(f"end {step}".encode().ljust(16))
    (flags / f"saved-{step}").touch()
"""
SIZE = 4 << 20
# a launcher that outlives SIGTERM (torchrun's way) while its worker, train.py, dies of it
LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: None)
subprocess.run([sys.executable, *sys.argv[1:]])
time.sleep(3600)
"""


class Stepped:
    """The job's process, saving its checkpoint in place when told, and a Keeper wired to it as the agent's is."""

    def __init__(self, tmp_path: Path, store: MemoryStore, *, launcher: bool = False) -> None:
        self.flags, self.said, self.store = tmp_path / "flags", list[str](), store
        self.flags.mkdir()
        spec = JobSpec.model_validate({"instance_type": "t3.micro", "run": "python3 train.py"})
        self.keeper = Keeper(Registry(store), Layout(tmp_path / "ml"), spec, Node("j", 1, 0), interval=60,
                             say=self.said.append, step=lambda: None, processes=lambda: self.proc)
        self.keeper.checkpoint_dir.mkdir(parents=True)
        (tmp_path / "train.py").write_text(STEPPED)
        (tmp_path / "launch.py").write_text(LAUNCHER)
        self.proc = UserProcess(f"exec {sys.executable} {'launch.py ' if launcher else ''}train.py"
                                f" {self.keeper.checkpoint_dir / 'ckpt.pt'} {SIZE} {self.flags}", tmp_path,
                                dict(os.environ), OutputLog(None))
        self.stop = threading.Event()

    def save(self, step: int, *, half: bool = False) -> None:
        # in one rename: train.py polls for the name, and could read the file between its creation and its write
        # (empty: a whole save), then wait for save 4 while the test waits for half of 3 (a quiet make test did)
        told = self.flags / f".save-{step}"
        told.write_text("half" if half else "whole")
        told.replace(self.flags / f"save-{step}")
        wait_for(f"save {step}", (self.flags / f"{'half' if half else 'saved'}-{step}").exists)

    def synced_twice_then_midway(self) -> None:
        """Saves 1 and 2, each synced; then save 3, which stops midway until killed."""
        for step in (1, 2):
            self.save(step)
            self.keeper.periodic(self.stop)
        self.save(3, half=True)

    def preempt(self, grace: float = 0.5) -> None:
        """As the agent at a Spot notice: freeze, record what is open, SIGTERM (train.py has no handler: it dies at
        once), the grace, SIGKILL."""
        self.proc.terminate(grace, frozen=self.keeper.freeze)

    def restored(self, dest: Path) -> int | None:
        CheckpointSync(self.store, dest, PREFIX).restore(announce=False)
        return version(dest / "ckpt.pt", SIZE)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate(0)


def test_a_sync_that_looks_after_the_agent_cut_a_save_midway_keeps_the_whole_version_before_it(
        tmp_path: Path) -> None:
    """The checkpoint thread's sync can come due between the kill and the agent's stop: the file it finds is
    closed and quiet, but torn. It must not be taken for whole (it was, then stood as the previous version)."""
    job = Stepped(tmp_path, MemoryStore())
    try:
        job.synced_twice_then_midway()
        job.preempt()
        job.keeper.periodic(job.stop)  # due before the main thread sets the stop
        job.stop.set()
        job.keeper.final(None, None)
    finally:
        job.close()
    assert job.restored(tmp_path / "r") == 2
    [line] = job.said
    assert re.fullmatch(r"checkpoint ckpt\.pt left out: open for writing when the job's processes were stopped, so it"
                        r" may be half-written; the previous version \(\d+ s old\) stays", line), line


def test_an_upload_the_kill_overtook_keeps_the_whole_version_before_it(tmp_path: Path) -> None:
    """A sync's upload in flight when a save begins and the agent's signal cuts it: what the sync then takes (a
    copy 'between two saves' of a file nothing holds open any more) must not be the torn one."""

    class Held(MemoryStore):  # an upload of a checkpoint file, once armed, waits after reading it
        def __init__(self) -> None:
            super().__init__()
            self.armed, self.reading, self.release = threading.Event(), threading.Event(), threading.Event()

        def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
            if "/files/" in key and self.armed.is_set() and not self.release.is_set():
                data = path.read_bytes()
                self.reading.set()
                self.release.wait(30)
                return self.put(key, data)
            return super().upload_file(key, path)

    store = Held()
    job = Stepped(tmp_path, store)
    sync = threading.Thread(target=job.keeper.periodic, args=(job.stop,))
    try:
        job.save(1)
        job.keeper.periodic(job.stop)
        job.save(2)
        store.armed.set()
        sync.start()
        assert store.reading.wait(30)
        job.save(3, half=True)  # begins while step 2 is uploaded
        job.preempt()
        store.release.set()
        sync.join(30)
        job.stop.set()
        job.keeper.final(None, None)
    finally:
        store.release.set()
        job.close()
    assert job.restored(tmp_path / "r") == 2, job.said


def states(pgid: int) -> str:
    found = ""
    for pid in members(pgid):
        with contextlib.suppress(OSError):
            found += Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return found


def test_a_pause_for_a_copy_is_bounded_and_thawed_and_never_overlaps_a_stop(tmp_path: Path) -> None:
    proc = UserProcess(f"exec {sys.executable} -c 'import time\nwhile True: time.sleep(0.01)'", tmp_path,
                       dict(os.environ), OutputLog(None))
    try:
        wait_for("the process", lambda: states(proc.pid) == "S")
        with proc.paused(0.3) as pause:
            assert pause is not None and pause.held() and states(proc.pid) == "T"
            time.sleep(1.5)  # a holder slower than its limit: the watchdog continues the job anyway
            assert not pause.held() and states(proc.pid) in ("S", "R")
        assert 0.29 < pause.seconds < 1.2

        stopped = threading.Event()
        with proc.paused(5) as pause:
            assert pause is not None
            stopping = threading.Thread(target=lambda: (proc.terminate(1), stopped.set()))
            stopping.start()
            assert not stopped.wait(0.3), "the stop waits for the pause in effect"
            assert states(proc.pid) == "T"
        stopping.join(10)
        assert stopped.is_set() and not proc.running()
        with proc.paused(1) as late:
            assert late is None  # none starts once the job is being stopped
    finally:
        if proc.poll() is None:
            proc.terminate(0)


def test_a_sync_during_the_grace_takes_nothing_a_sigterm_cut_though_the_job_lives_on(tmp_path: Path) -> None:
    """Between SIGTERM and SIGKILL the job may go on saving, so syncs go on; but a launcher that outlives SIGTERM
    keeps the job alive while the worker it cut lies closed and quiet: open at the signal, unchanged since, it is
    not taken."""
    job = Stepped(tmp_path, MemoryStore(), launcher=True)
    stopping = threading.Thread(target=job.preempt, kwargs={"grace": 30})
    try:
        job.synced_twice_then_midway()
        stopping.start()
        wait_for("the worker's end", lambda: len(members(job.proc.pid)) == 1)  # the launcher lives on
        assert job.proc.running()
        job.keeper.periodic(job.stop)  # a sync due in the grace
        assert job.restored(tmp_path / "r") == 2
    finally:
        job.close()
        if stopping.ident is not None:  # not started when the setup failed: its error is the one to see
            stopping.join(60)
    job.stop.set()
    job.keeper.final(None, None)
    assert job.restored(tmp_path / "r2") == 2

