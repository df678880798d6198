"""Checkpoints written the way real scripts write them: in place, as often as every few milliseconds, with
no signal handler. A file is complete when no process holds it open for writing (the kernel's view, read
from /proc); at a kill, what the frozen processes held open is left out and said; nothing is silent."""

from __future__ import annotations

import json
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import OPEN, CheckpointSync
from jobplane.agent.keeper import MID_WRITE, Keeper, Node
from jobplane.agent.layout import Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.agent.writers import open_for_writing, writing
from jobplane.clouds.memory import MemoryStore
from jobplane.model import keys, records
from jobplane.model.spec import JobSpec
from jobplane.store.registry import Registry
from tests.agent.test_checkpoints import PREFIX, manifests, restore
from tests.helpers import wait_for

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")]


def test_the_kernel_says_which_files_are_open_for_writing(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("read.pt", "mapped.npy", "sub/written.pt", "appended.log"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    reader = (tmp_path / "read.pt").open("rb")
    written = (tmp_path / "sub" / "written.pt").open("r+b")
    appended = (tmp_path / "appended.log").open("ab")
    with (tmp_path / "mapped.npy").open("r+b") as f:  # numpy.memmap: writable, shared, and no fd left open
        mapped = mmap.mmap(f.fileno(), 4096)
    try:
        assert open_for_writing(tmp_path) == {"sub/written.pt", "appended.log", "mapped.npy"}
        assert open_for_writing(tmp_path / "sub") == {"written.pt"}
    finally:
        for handle in (reader, written, appended, mapped):
            handle.close()
    assert open_for_writing(tmp_path) == set()
    assert open_for_writing(tmp_path, proc=tmp_path / "no-proc") is None  # the kernel cannot tell: fallback


class Rewriter:
    """A training loop that saves `checkpoint.json` in place (open "w", write, close) every `every` seconds
    and never renames: each version is whole between two saves, torn during one."""

    def __init__(self, path: Path, every: float, pad: int = 0) -> None:
        self.path, self.every, self.pad, self.step = path, every, pad, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step += 1
            with self.path.open("w") as f:
                f.write(json.dumps({"step": self.step, "pad": "x" * self.pad}))
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.step


def whole_step(data: bytes) -> int:
    return int(json.loads(data)["step"])  # a torn version does not parse


def test_a_file_rewritten_in_place_every_100_ms_reaches_the_bucket_whole_at_every_sync(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    sync = CheckpointSync(store, ckpt, PREFIX, settle=5.0)  # the settle rule would never upload it
    saver = Rewriter(ckpt / "checkpoint.json", every=0.1, pad=20_000)
    try:
        wait_for("the first save", lambda: saver.step > 1)
        steps: list[int] = []

        def uploaded() -> bool:  # a sync may catch a save in progress (held): the next one takes the file
            if sync.sync().files:
                steps.append(whole_step(restore(store, tmp_path / f"r{len(steps)}")["checkpoint.json"]))
            time.sleep(0.05)
            return len(steps) == 5

        wait_for("five uploads", uploaded, timeout=30)
    finally:
        saver.stop()
    assert steps == sorted(steps) and steps[-1] > steps[0], f"every sync moved the checkpoint on: {steps}"


def test_a_file_rewritten_during_every_upload_is_uploaded_from_a_copy_taken_between_two_saves(
        tmp_path: Path) -> None:
    class Slow(MemoryStore):  # an upload takes longer than the script's save interval
        def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
            data = path.read_bytes()
            time.sleep(0.3)
            return self.put(key, data)

    store, ckpt = Slow(), tmp_path / "ckpt"
    ckpt.mkdir()
    said: list[str] = []
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append)
    # saved every 0.2 s, so during every 0.3 s upload; not faster: under load one /proc look takes ~50 ms, and a
    # copy needs a moment in which nothing holds the file open
    saver = Rewriter(ckpt / "checkpoint.json", every=0.2)
    try:
        wait_for("the first save", lambda: saver.step > 1)
        at_sync = saver.step
        # the scan may catch a save in progress (held, like an empty file first seen): the next sync takes it
        wait_for("an upload", lambda: sync.sync().files == 1, timeout=30)
    finally:
        saver.stop()
    assert whole_step(restore(store, tmp_path / "r")["checkpoint.json"]) >= at_sync
    assert not list((tmp_path / ".ckpt.staging").iterdir()), "the private copies are removed"
    assert not said


def test_a_file_kept_open_is_named_once_when_overdue_and_the_settle_rule_is_the_fallback(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    said: list[str] = []
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append, overdue_after=0.2, step=lambda: 7)
    (ckpt / "model.pt").write_bytes(b"v1")
    sync.sync()
    with (ckpt / "events.log").open("ab") as held:  # a writer that never closes it (a log kept open)
        held.write(b"a")
        held.flush()
        sync.sync()
        assert not said, "not overdue yet"
        time.sleep(0.25)
        sync.sync()
        sync.sync()
    [line] = said
    assert line.startswith("checkpoint events.log has not reached the bucket for ")
    assert line.endswith(f" s: {OPEN}; no earlier version of it is in the bucket")
    assert sync.sync().files == 1 and "events.log" in restore(store, tmp_path / "r")  # closed: uploaded

    blind_dir = tmp_path / "blind"
    blind_dir.mkdir()
    blind = CheckpointSync(MemoryStore(), blind_dir, PREFIX, settle=0.1, writers=lambda: None)  # no /proc
    saver = Rewriter(blind_dir / "checkpoint.json", every=0.02)
    try:
        wait_for("the first save", lambda: saver.step > 0)
        assert blind.sync().files == 0  # changed within 0.1 s: settle-by-time cannot take it
    finally:
        saver.stop()
    assert blind.sync().files == 1  # quiet now


def test_the_final_sync_leaves_out_what_was_open_at_the_kill_and_says_which_version_stays(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    said: list[str] = []
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append, step=lambda: 140)
    (ckpt / "ckpt.pt").write_bytes(b"step 140 END")
    sync.sync()
    (ckpt / "ckpt.pt").write_bytes(b"step 15")  # in place, killed mid-write
    (ckpt / "extra.pt").write_bytes(b"written whole just before the kill")  # closed: complete
    why = "open for writing when the job's processes were stopped"
    sync.sync(final=True, leave_out={"ckpt.pt": why})
    assert restore(store, tmp_path / "r") == {"ckpt.pt": b"step 140 END",
                                              "extra.pt": b"written whole just before the kill"}
    assert said == [f"checkpoint ckpt.pt left out: {why}; the previous version (step 140, 0 s old) stays"]
    assert manifests(store)[-1]["step"] == 140


IGNORES_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = sys.argv[1]
while True:  # saves in place, back to back: always mid-write, never renamed
    with open(path, "wb") as f:
        for _ in range(200):
            f.write(b"x" * 4096)
            time.sleep(0.001)
"""


def test_before_each_signal_the_group_is_frozen_and_what_it_writes_is_recorded(tmp_path: Path) -> None:
    """SIGTERM is ignored, so SIGKILL follows the grace: both see the file open; the process never runs
    between the look and the signal (it is stopped), so what the look saw is what the signal cut."""
    target = tmp_path / "ckpt" / "checkpoint.pt"
    target.parent.mkdir()
    (tmp_path / "writer.py").write_text(IGNORES_SIGTERM)
    seen: list[tuple[set[str] | None, str]] = []

    def frozen() -> None:
        states = {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in members(proc.pid)}
        seen.append((open_for_writing(target.parent), "".join(sorted(states))))

    proc = UserProcess(f"exec {sys.executable} writer.py {target}", tmp_path, dict(os.environ), OutputLog(None))
    try:
        wait_for("the writer", lambda: target.exists() and target.stat().st_size > 0)
        assert proc.terminate(0.3, frozen=frozen) == 128 + signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.terminate(0)
    assert seen == [({"checkpoint.pt"}, "T"), ({"checkpoint.pt"}, "T")]


def members(pgid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def test_every_process_counts_not_only_the_jobs_session(tmp_path: Path) -> None:
    """A data-loader worker that started its own session still writes the job's checkpoint."""
    target = tmp_path / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM, str(target)], start_new_session=True)
    try:
        wait_for("the writer", lambda: target.exists())
        wait_for("the writer's file in the kernel's view",
                 lambda: "checkpoint.pt" in (open_for_writing(tmp_path) or set()))
        assert str(target) in (writing() or set())
    finally:
        proc.kill()
        proc.wait()


def keeper_of(tmp_path: Path, reg: Registry, attempt: int, said: list[str]) -> Keeper:
    spec = JobSpec.model_validate({"instance_type": "t3.micro", "run": "python3 train.py"})
    return Keeper(reg, Layout(tmp_path / f"attempt{attempt}"), spec, Node("j", attempt, 0), interval=60,
                  say=said.append, step=lambda: None)


def test_a_resume_says_what_it_restored_and_warns_when_a_long_attempt_left_nothing(tmp_path: Path) -> None:
    reg, said = Registry(MemoryStore()), []
    started = datetime.now(UTC) - timedelta(minutes=20)
    reg.put_json(keys.exit_report("j", 1, 0), records.ExitReport(
        code=143, reason="preempted", instance_id="i-1", started_at=started,
        ended_at=started + timedelta(minutes=12)).body())
    assert keeper_of(tmp_path, reg, 2, said).restore(lambda what, fn: fn()).files == 0
    assert said == ["no checkpoint to restore, although attempt 1 ran for 12 min (checkpoints are synced every"
                    " 60 s): its progress is lost; its log says why (`jobplane logs j --attempt 1`)"]

    said.clear()  # attempt 2 saves one; attempt 3 restores it and says which manifest, how old, how many files
    second = keeper_of(tmp_path, reg, 2, said)
    second.checkpoint_dir.mkdir(parents=True)
    (second.checkpoint_dir / "checkpoint.pt").write_bytes(b"weights")
    second.final(None, None)
    assert keeper_of(tmp_path, reg, 3, said).restore(lambda what, fn: fn()).files == 1
    assert len(said) == 2 and said[0].startswith("final checkpoint sync: 1 files")
    assert re.fullmatch(r"restored 1 checkpoint files into \S+/attempt3/checkpoints \(manifest 0/00000001\.json,"
                        r" \d s old: 1 files, 7 bytes in .*\)", said[1]), said[1]



def test_the_freeze_reads_the_group_before_the_signal_and_every_other_process_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 64: the whole machine's /proc, read with the job frozen, held a Trainer's SIGTERM back. Only the
    group's files are read before the signal now; a process outside it (its own session: the signal does not reach
    it) is still read, a moment after, and both files are left out of the final sync."""
    spec = JobSpec.model_validate({"instance_type": "t3.micro", "run": "python3 train.py"})
    procs: list[UserProcess] = []
    keeper = Keeper(Registry(MemoryStore()), Layout(tmp_path / "a1"), spec, Node("j", 1, 0), interval=60,
                    say=print, step=lambda: None, processes=lambda: procs[0] if procs else None)
    ckpt = keeper.checkpoint_dir
    ckpt.mkdir(parents=True)
    (tmp_path / "writer.py").write_text(IGNORES_SIGTERM)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'wb'); f.write(b'x');"
                               " f.flush(); time.sleep(60)", str(ckpt / "other.pt")], start_new_session=True)
    read: list[set[int] | None] = []  # the processes each look read (None: every one)

    def spy(*, only: list[int] | None = None, but: list[int] | None = None) -> set[str] | None:
        read.append(None if only is None else set(only))
        return writing(only=only, but=but or ())

    try:
        procs.append(UserProcess(f"exec {sys.executable} writer.py {ckpt / 'checkpoint.pt'}", tmp_path,
                                 dict(os.environ), OutputLog(None)))
        wait_for("both writers", lambda: {"checkpoint.pt", "other.pt"} <= (open_for_writing(ckpt) or set()))
        monkeypatch.setattr("jobplane.agent.keeper.writing", spy)
        assert procs[0].terminate(0.3, frozen=keeper.freeze) == 128 + signal.SIGKILL
        assert read[0] == {procs[0].pid}  # before SIGTERM: the group alone
        assert keeper.left_out(ckpt) == dict.fromkeys(["checkpoint.pt", "other.pt"], MID_WRITE)
        assert None in read  # the rest, after the signal
    finally:
        holder.kill()
        holder.wait()
        if procs and procs[0].poll() is None:
            procs[0].terminate(0)
