"""Lightning's last.ckpt is of its series (issue 64): ckpt_path="last" resumes from it alone, so the bucket never
names a version of it older than the newest whole epoch=..-step=.. save beside it; that save stands in for it. Its
own step is read from the checkpoint (agent/saves.py's saved_step), never unpickled. The cut mid-write, with
writers in Lightning's order, is tests/agent/test_library_saves.py's."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.agent.saves import saved_step
from jobplane.clouds.memory import MemoryStore
from tests.agent.library_writer import lightning_checkpoint, resume_lightning
from tests.agent.test_checkpoints import PREFIX, manifests, restore


def test_the_step_of_a_lightning_checkpoint_is_read_from_its_pickle_and_a_torn_one_has_none(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    for step in (0, 45, 70_000, 2**40):  # BININT1, BININT, LONG1
        path.write_bytes(lightning_checkpoint(step, 100))
        assert saved_step(path) == step
    whole = lightning_checkpoint(45, 3000)
    path.write_bytes(whole[:len(whole) * 2 // 3])  # cut in its commit: the zip's directory is at its end
    assert saved_step(path) is None
    path.write_bytes(pickle.dumps({"global_step": 5}))  # not a zip
    assert saved_step(path) is None
    torch = pytest.importorskip("torch")  # the examples' pin; not a dev dependency
    torch.save({"epoch": 3, "global_step": 123_456, "pytorch-lightning_version": "2.6.6",
                "state_dict": {"w": torch.zeros(4)}, "loops": {}}, path)
    assert saved_step(path) == 123_456


def write(ckpt: Path, name: str, step: int) -> None:
    ckpt.mkdir(exist_ok=True)
    (ckpt / name).write_bytes(lightning_checkpoint(step, 500))


def named_as(store: MemoryStore, rel: str) -> str:
    return str(manifests(store)[-1]["files"][rel]["key"])  # type: ignore[index]


def test_a_sync_between_a_save_and_its_last_ckpt_names_the_save_as_last_ckpt(tmp_path: Path) -> None:
    """A VM lost without a final sync keeps the newest manifest: one written after ModelCheckpoint's new
    epoch=..-step=.. file and before its last.ckpt would have resumed the older last.ckpt beside an orphan."""
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    sync = CheckpointSync(store, ckpt, PREFIX, writers=set)
    write(ckpt, "epoch=0-step=15.ckpt", 15)
    write(ckpt, "last.ckpt", 15)
    sync.sync()
    assert named_as(store, "last.ckpt") != named_as(store, "epoch=0-step=15.ckpt")  # its own upload
    write(ckpt, "epoch=0-step=30.ckpt", 30)  # last.ckpt not written yet
    sync.sync()
    assert named_as(store, "last.ckpt") == named_as(store, "epoch=0-step=30.ckpt")
    restore(store, tmp_path / "r1")
    assert resume_lightning(tmp_path / "r1") == 30
    write(ckpt, "last.ckpt", 30)
    sync.sync()
    assert named_as(store, "last.ckpt") != named_as(store, "epoch=0-step=30.ckpt")
    write(ckpt, "last.ckpt", 45)  # save_top_k by a metric: 45 is not among the best, only last.ckpt has it
    sync.sync()
    restore(store, tmp_path / "r2")
    assert resume_lightning(tmp_path / "r2") == 45
    assert {i.key for i in store.list(PREFIX + "files/")} == {
        PREFIX + entry["key"] for entry in manifests(store)[-1]["files"].values()}  # type: ignore[attr-defined]


def test_no_last_ckpt_is_made_up_for_a_job_without_one(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    sync = CheckpointSync(store, ckpt, PREFIX, writers=set)
    write(ckpt, "epoch=0-step=15.ckpt", 15)
    sync.sync()
    assert set(manifests(store)[-1]["files"]) == {"epoch=0-step=15.ckpt"}  # type: ignore[call-overload]
