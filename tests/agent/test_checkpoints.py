"""Checkpoints are never torn: only complete files are uploaded, a manifest written last names them, and
restore brings back exactly what the newest manifest names (so deletions stick)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import LEFTOVER_AGE, CheckpointSync, publish
from jobplane.agent.writers import writing
from jobplane.clouds.memory import MemoryStore
from jobplane.model import keys
from tests.agent.conftest import World, console_of
from tests.helpers import data_of, wait_for

pytestmark = pytest.mark.timeout(90)
PREFIX = "jobs/j/checkpoints/"


def manifests(store: MemoryStore, rank: int = 0) -> list[dict[str, object]]:
    return [json.loads(store.get(i.key).data) for i in store.list(f"{PREFIX}manifests/{rank}/")]


def publish_by_rename(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def restore(store: MemoryStore, dest: Path, rank: int = 0) -> dict[str, bytes]:
    """What the next attempt would restore (a look: it writes nothing)."""
    CheckpointSync(store, dest, PREFIX, rank=rank).restore(announce=False)
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def only_what_the_manifest_names(store: MemoryStore) -> bool:
    """The bucket holds exactly one manifest and the file objects it names."""
    [manifest] = manifests(store)
    named = {PREFIX + entry["key"] for entry in manifest["files"].values()}  # type: ignore[attr-defined]
    return {i.key for i in store.list(PREFIX + "files/")} == named


@pytest.mark.parametrize("kernel", [True, False], ids=["open-for-writing", "settle-fallback"])
def test_work_in_progress_is_never_uploaded_and_a_growing_file_waits(tmp_path: Path, kernel: bool) -> None:
    """By the kernel's view (the file is open for writing) or, where it cannot tell, by settle-by-time."""
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    (ckpt / "step-2.tmp").mkdir(parents=True)  # a directory being assembled: nothing in it is uploaded
    (ckpt / "step-2.tmp" / "shard-0").write_bytes(b"half")
    (ckpt / ".ckpt-2.tmp.npz").write_bytes(b"numpy's temporary name")
    sync = CheckpointSync(store, ckpt, PREFIX, settle=0.2, writers=writing if kernel else lambda: None)
    publish_by_rename(ckpt / "ckpt-1.pt", b"one")
    moved = sync.sync()
    assert moved.files == 1 and [sorted(m["files"]) for m in manifests(store)] == [["ckpt-1.pt"]]

    growing = ckpt / "growing.bin"
    stop = threading.Event()

    def write_slowly() -> None:
        with growing.open("wb") as f:
            while not stop.is_set():
                f.write(b"x" * 100)
                f.flush()
                time.sleep(0.02)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        wait_for("the writer", growing.exists)
        for _ in range(3):
            assert sync.sync().files == 0  # open for writing (or changed between the two scans) every time
    finally:
        stop.set()
        writer.join()
    assert sync.sync().files == 1  # now closed (or quiet for a whole settle interval)
    assert sorted(manifests(store)[-1]["files"]) == ["ckpt-1.pt", "growing.bin"]  # type: ignore[call-overload]
    assert sync.sync().files == 0 and len(manifests(store)) == 1  # nothing changed: no new manifest


def test_restore_uses_the_newest_manifest_only_and_deletions_stick(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    sync = CheckpointSync(store, ckpt, PREFIX, settle=0.05)
    for step in (1, 2, 3):
        publish_by_rename(ckpt / f"ckpt-{step}.pt", f"weights {step}".encode())
    publish_by_rename(ckpt / "latest", b"3")
    sync.sync()
    (ckpt / "ckpt-1.pt").unlink()  # the job keeps the last two
    publish_by_rename(ckpt / "latest", b"4")
    publish_by_rename(ckpt / "ckpt-4.pt", b"weights 4")
    sync.sync()
    (ckpt / "ckpt-2.pt").unlink()
    sync.sync()
    assert restore(store, tmp_path / "attempt2") == {"ckpt-3.pt": b"weights 3", "ckpt-4.pt": b"weights 4",
                                                     "latest": b"4"}
    assert only_what_the_manifest_names(store), "old versions are gone"


def test_a_sync_cut_short_leaves_the_previous_manifest_in_force(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    sync = CheckpointSync(store, ckpt, PREFIX, settle=0.05)
    publish_by_rename(ckpt / "model.pt", b"good")
    sync.sync()
    original = store.upload_file

    def flaky(*args: object, **kw: object) -> str:
        original(*args, **kw)  # type: ignore[arg-type]
        raise OSError("injected: connection reset after the last part")

    store.upload_file = flaky  # type: ignore[method-assign]
    publish_by_rename(ckpt / "model.pt", b"newer, but its upload failed")
    assert sync.sync().failed == ["model.pt"] and len(manifests(store)) == 1  # nothing new to name

    def gone(*args: object, **kw: object) -> str:
        raise SystemExit("the VM is gone")  # between the uploads and the manifest: a preemption mid-sync

    store.upload_file = original  # type: ignore[method-assign]
    store.put_if_absent = gone  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        sync.sync()
    assert restore(store, tmp_path / "next") == {"model.pt": b"good"}

    # the next attempt keeps what the cut-short sync left unnamed while its life may still be syncing (F6),
    # and deletes it once it is older than LEFTOVER_AGE and its own first manifest stands
    store.put_if_absent = MemoryStore.put_if_absent.__get__(store)  # type: ignore[method-assign]
    soon = CheckpointSync(store, tmp_path / "soon", PREFIX, attempt=2, settle=0.05)
    soon.restore()
    publish_by_rename(tmp_path / "soon" / "model.pt", b"attempt 2, soon after")
    soon.sync()
    assert not only_what_the_manifest_names(store), "a recent leftover is kept: an earlier life may still name it"
    later = datetime.now(UTC) + LEFTOVER_AGE + timedelta(minutes=1)
    second = CheckpointSync(store, tmp_path / "next", PREFIX, attempt=2, settle=0.05, clock=lambda: later)
    second.restore()
    publish_by_rename(tmp_path / "next" / "model.pt", b"attempt 2")
    second.sync()
    assert only_what_the_manifest_names(store)


def test_final_sync_after_a_kill_leaves_out_files_written_in_place_at_the_end(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    ckpt.mkdir()
    sync = CheckpointSync(store, ckpt, PREFIX, settle=0.05)
    (ckpt / "model.pt").write_bytes(b"complete v1")
    sync.sync()
    publish_by_rename(ckpt / "extra.pt", b"saved a while before the kill")
    died = time.time_ns()
    os.utime(ckpt / "extra.pt", ns=(died - 5_000_000_000,) * 2)
    (ckpt / "model.pt").write_bytes(b"torn v2 ...")  # in place, when the process was killed
    sync.sync(final=True, cut_ns=died - 1_000_000_000)
    assert restore(store, tmp_path / "next") == {"model.pt": b"complete v1",
                                                 "extra.pt": b"saved a while before the kill"}


def test_every_node_restores_the_union_and_rank_0_wins(tmp_path: Path) -> None:
    store = MemoryStore()
    for rank, files in ((0, {"model.pt": b"rank0", "shard-0": b"s0"}), (1, {"model.pt": b"rank1", "shard-1": b"s1"})):
        local = tmp_path / f"rank{rank}"
        local.mkdir()
        for name, data in files.items():
            (local / name).write_bytes(data)
        CheckpointSync(store, local, PREFIX, rank=rank).sync(final=True)
    again = tmp_path / "rank1-attempt2"
    assert restore(store, again, rank=1) == {"model.pt": b"rank0", "shard-0": b"s0", "shard-1": b"s1"}
    # rank 1's next manifest names only its own file: another rank's objects are never referenced
    sync = CheckpointSync(store, again, PREFIX, rank=1, settle=0.05)
    sync.restore()
    (again / "shard-1").unlink()
    sync.sync()
    assert [sorted(m["files"]) for m in manifests(store, 1)] == [[]]  # type: ignore[call-overload]


def test_artifacts_are_published_with_a_manifest_and_stale_objects_removed(tmp_path: Path) -> None:
    store, model = MemoryStore(), tmp_path / "model"
    model.mkdir()
    store.put("jobs/j/artifacts/model/from-attempt-1.bin", b"old")
    (model / "weights.bin").write_bytes(b"w" * 10)
    (model / "export.onnx.tmp").write_bytes(b"unfinished")
    assert publish(store, model, "jobs/j/artifacts/model/").files == 1
    assert [i.key for i in store.list("jobs/j/artifacts/")] == ["jobs/j/artifacts/model.manifest.json",
                                                                "jobs/j/artifacts/model/weights.bin"]
    manifest = json.loads(store.get("jobs/j/artifacts/model.manifest.json").data)
    assert manifest["files"] == {"weights.bin": {"key": "weights.bin", "size": 10,
                                                 "version": store.get("jobs/j/artifacts/model/weights.bin").version}}


# ---- the real agent ---------------------------------------------------------------------------------------
SLOW_WRITER = """
import json, os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"])
if any(ckpt.iterdir()):  # a rerun: report what was restored, as a training script would resume from it
    print("RESTORED " + json.dumps({p.name: p.read_bytes().endswith(b"END\\n") for p in sorted(ckpt.iterdir())}))
    sys.exit(0)
def body(step, size):
    return f"step {step}\\n".encode() + b"x" * size + b"\\nEND\\n"
tmp = ckpt / "ckpt-1.bin.tmp"
tmp.write_bytes(body(1, 4096))
tmp.replace(ckpt / "ckpt-1.bin")  # published whole
print("published ckpt-1", flush=True)
with open(ckpt / "ckpt-2.bin", "wb") as f:  # in place, slowly, never finished: preempted midway
    f.write(b"step 2\\n")
    for i in range(6000):
        f.write(b"x" * 512)
        f.flush()
        time.sleep(0.01)
    f.write(b"\\nEND\\n")
print("never reached", flush=True)
"""


def assert_never_torn(world: World, job_id: str) -> list[str]:
    """Every file the newest manifest names ends with END, i.e. was written whole; returns their names."""
    restored = world.checkpoint(job_id)
    torn = [name for name, data in restored.items() if not data.endswith(b"END\n")]
    assert not torn, f"the newest manifest names torn files: {torn}"
    return sorted(restored)


def test_a_preemption_mid_write_never_leaves_a_torn_checkpoint(world: World) -> None:
    world.seed("torn-job", {"run": "python3 writer.py", "spot": True, "stop_grace": 10},
               code={"writer.py": SLOW_WRITER})
    node = world.start("torn-job")
    ckpt_dir = node.ml_root / "checkpoints"
    wait_for("ckpt-1 in a manifest", lambda: "ckpt-1.bin" in world.checkpoint("torn-job"), 30)
    seen = []
    # several periodic syncs run while ckpt-2 grows; none may name it (looked at five times a sync interval: a
    # restore as fast as it goes made thousands in the 3 s, each a directory of files)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        seen.append(assert_never_torn(world, "torn-job"))
        time.sleep(0.1)
    assert (ckpt_dir / "ckpt-2.bin").stat().st_size > 0, "the writer did not start ckpt-2"
    node.imds.set_notice("terminate")
    assert node.wait(30) == 0, console_of(node)
    assert not (ckpt_dir / "ckpt-2.bin").read_bytes().endswith(b"END\n")  # it really was torn
    assert world.json(keys.exit_report("torn-job", 1, 0))["code"] == 143  # died by SIGTERM mid-write
    assert assert_never_torn(world, "torn-job") == ["ckpt-1.bin"]
    assert all(names == ["ckpt-1.bin"] for names in seen)

    world.next_attempt("torn-job", 2)  # attempt 2, on a fresh VM, restores the previous complete checkpoint
    second = world.start("torn-job", attempt=2, extra=["--attempt", "2"])
    assert second.wait(30) == 0, console_of(second)
    assert f'RESTORED {json.dumps({"ckpt-1.bin": True})}' in world.logs("torn-job", attempt=2)


DELETER = """
import os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"])
if any(ckpt.iterdir()):
    print("RESTORED", sorted(os.listdir(ckpt)))
    sys.exit(0)
for step in (1, 2):
    (ckpt / f"ckpt-{step}.pt.tmp").write_text(f"weights {step}")
    os.replace(ckpt / f"ckpt-{step}.pt.tmp", ckpt / f"ckpt-{step}.pt")
go = ckpt.parent / "go"
while not go.exists():  # the test lets us go once both are in the bucket
    time.sleep(0.05)
(ckpt / "ckpt-1.pt").unlink()  # keep the last two
(ckpt / "ckpt-3.pt.tmp").write_text("weights 3")
os.replace(ckpt / "ckpt-3.pt.tmp", ckpt / "ckpt-3.pt")
"""


def test_a_checkpoint_deleted_locally_is_not_restored_on_the_next_attempt(world: World) -> None:
    world.seed("del-job", {"run": "python3 keep_two.py", "spot": True}, code={"keep_two.py": DELETER})
    node = world.start("del-job")
    wait_for("ckpt-1 and ckpt-2 in a manifest",
             lambda: {"ckpt-1.pt", "ckpt-2.pt"} <= set(world.checkpoint("del-job")), 30)
    (node.ml_root / "go").touch()
    assert node.wait(30) == 0, console_of(node)
    assert world.checkpoint("del-job") == {"ckpt-2.pt": b"weights 2", "ckpt-3.pt": b"weights 3"}
    prefix = keys.checkpoints_prefix(data_of(world.reg, "del-job"))
    assert not [k for k, _, _ in world.reg.listing(prefix) if "ckpt-1" in k]

    world.next_attempt("del-job", 2)
    second = world.start("del-job", attempt=2, extra=["--attempt", "2"])
    assert second.wait(30) == 0, console_of(second)
    assert "RESTORED ['ckpt-2.pt', 'ckpt-3.pt']" in world.logs("del-job", attempt=2)


def test_restored_files_are_not_uploaded_again(tmp_path: Path) -> None:
    store = MemoryStore()
    first = tmp_path / "a1"
    first.mkdir()
    (first / "latest.pt").write_bytes(b"x")
    CheckpointSync(store, first, PREFIX).sync(final=True)
    second = tmp_path / "a2"
    sync = CheckpointSync(store, second, PREFIX, settle=0.05)
    sync.restore()
    puts = store.calls.get("upload_file", 0)
    assert sync.sync().files == 0 and store.calls.get("upload_file", 0) == puts
    os.utime(second / "latest.pt", ns=(1, 1))  # touched by the job: uploaded
    assert sync.sync().files == 1


def test_the_final_sync_returns_by_its_deadline_with_the_newest_file_named(tmp_path: Path) -> None:
    """The Spot notice's window: uploads that cannot finish are abandoned, the newest went first."""
    release = threading.Event()

    class Stuck(MemoryStore):
        def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
            if not key.endswith("ckpt-9.pt"):
                release.wait(60)  # a slow network: these do not finish before the deadline
            return super().upload_file(key, path)

    store, ckpt = Stuck(), tmp_path / "ckpt"
    ckpt.mkdir()
    for step in range(10):
        (ckpt / f"ckpt-{step}.pt").write_bytes(b"w" * step)
        os.utime(ckpt / f"ckpt-{step}.pt", ns=(step * 10**9, step * 10**9))  # ckpt-9 is the newest
    sync = CheckpointSync(store, ckpt, PREFIX)
    try:
        moved = sync.sync(final=True, deadline=time.monotonic() + 8)
    finally:
        release.set()
    assert moved.files == 1 and moved.skipped > 0  # the rest never started, or were left running
    assert [sorted(m["files"]) for m in manifests(store)] == [["ckpt-9.pt"]]  # type: ignore[call-overload]
