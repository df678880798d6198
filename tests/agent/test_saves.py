"""A save is not one file (issue 43): which files make one save of a training library and when it is whole
(agent/saves.py, a pure function of one scan), and what a sync does with them: a half save is never named, at a
stop nor while the job runs, the newest whole one stays in the bucket for the resume rule to pick, and a file the
job's rotation deletes during its upload is a deletion, said nowhere as a failure."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.agent.saves import judge
from jobplane.agent.transfer import Stat
from jobplane.clouds.memory import MemoryStore
from tests.agent.library_writer import TRAINER_FILES, resume_trainer
from tests.agent.test_checkpoints import PREFIX, manifests, restore

OPEN = "open for writing when the job's processes were stopped, so it may be half-written"


def scan(files: dict[str, int]) -> dict[str, Stat]:
    """name -> mtime (ns) as a scan's stats (size 1, inode 1)."""
    return {rel: (1, mtime, 1) for rel, mtime in files.items()}


def trainer_save(step: int, upto: int = len(TRAINER_FILES)) -> dict[str, int]:
    return {f"checkpoint-{step}/{name}": step for name in TRAINER_FILES[:upto]}


def test_the_trainers_half_save_is_not_whole_and_the_ones_before_it_are() -> None:
    stats = scan(trainer_save(240) | trainer_save(260) | trainer_save(280, upto=2))  # config, generation config
    saves = judge(stats, {}, {}, rank=0)
    assert saves.partial == {"checkpoint-280": "not finished: trainer_state.json is not there yet (the Hugging Face"
                                               " Trainer writes it last)"}
    assert saves.of["checkpoint-260/optimizer.pt"] == "checkpoint-260"
    # a file open at the stop makes its save partial, newest or not
    held = {"checkpoint-260/rng_state.pth": OPEN}
    assert judge(stats, held, {}, rank=0).partial["checkpoint-260"] == f"being written (rng_state.pth: {OPEN})"
    # cut between two files after the marker's first save: the predecessor says what is missing (any library)
    rank1 = scan({f"step_{n}/{name}": n for n in (1, 2) for name in ("model.pt", "optim.pt")} | {"step_3/model.pt": 3})
    assert judge(rank1, {}, {}, rank=1).partial == {"step_3": "not finished: it has no optim.pt, which step_2/ has"}


def test_a_marker_is_needed_where_the_library_writes_one() -> None:
    # DeepSpeed: global_stepN/ is whole once `latest` beside it names it
    stats = scan({f"global_step{n}/{name}": n for n in (10, 20) for name in ("mp_rank_00_model_states.pt", "zero.pt")}
                 | {"latest": 10})
    saves = judge(stats, {}, {"latest": "global_step10"}, rank=0)
    assert saves.partial == {"global_step20": "not finished: no latest beside it names it yet (DeepSpeed writes it"
                                              " after the save)"}
    assert saves.of["latest"] == "global_step10"  # it goes up with the save it names
    assert not judge(stats, {}, {"latest": "global_step20"}, rank=0).partial
    # nested in the Trainer's checkpoint (its DeepSpeed integration): numbers in inner names do not count as missing
    nested = scan({f"checkpoint-{n}/global_step{n}/mp_rank_00_model_states.pt": n for n in (20, 40)}
                  | {f"checkpoint-{n}/{name}": n for n in (20, 40) for name in ("latest", "trainer_state.json")})
    assert not judge(nested, {}, {}, rank=0).partial
    # torch.distributed.checkpoint saved again into one directory: .metadata must be newer than every shard
    dcp = scan({"model/__0_0.distcp": 5, "model/__1_0.distcp": 9, "model/.metadata": 7})
    assert judge(dcp, {}, {}, rank=0).partial == {
        "model": "not finished: .metadata is older than __1_0.distcp (torch.distributed.checkpoint writes it last)"}
    assert not judge(dcp | scan({"model/.metadata": 9}), {}, {}, rank=0).partial
    # the Trainer's FSDP sharded state: a DCP directory inside its checkpoint, with its own .metadata
    fsdp = scan(trainer_save(20) | {"checkpoint-20/pytorch_model_fsdp_0/__0_0.distcp": 20,
                                    "checkpoint-20/pytorch_model_fsdp_0/.metadata": 20})
    assert not judge(fsdp, {}, {}, rank=0).partial
    del fsdp["checkpoint-20/pytorch_model_fsdp_0/.metadata"]
    assert judge(fsdp, {}, {}, rank=0).partial == {"checkpoint-20": "not finished: pytorch_model_fsdp_0/.metadata is"
                                                                     " not there yet (torch.distributed.checkpoint"
                                                                     " writes it last)"}
    # rank 1's node never gets the coordinator's .metadata, nor rank 0's trainer_state.json: not waited for there
    assert not judge(scan({"step-1/__1_0.distcp": 1, "checkpoint-20/pytorch_model_fsdp_1.bin": 2}), {}, {},
                     rank=1).partial
    # Lightning's epoch=..-step=.. files are saves of one file: whole when closed; other names keep per-file rules
    files = scan({"epoch=0-step=100.ckpt": 1, "epoch=1-step=200.ckpt": 2, "last.ckpt": 2, "ckpt-7.pt": 3})
    saves = judge(files, {"epoch=1-step=200.ckpt": OPEN}, {}, rank=0)
    assert saves.partial == {"epoch=1-step=200.ckpt": f"being written (epoch=1-step=200.ckpt: {OPEN})"}
    assert set(saves.of) == {"epoch=0-step=100.ckpt", "epoch=1-step=200.ckpt"}


def write_trainer_save(ckpt: Path, step: int, upto: int = len(TRAINER_FILES)) -> None:
    (ckpt / f"checkpoint-{step}").mkdir(parents=True, exist_ok=True)
    for name in TRAINER_FILES[:upto]:
        (ckpt / f"checkpoint-{step}" / name).write_text(f"step {step}\n{name}\nend {step}\n")


def test_the_issues_preemption_resumes_from_the_whole_save_and_says_which(tmp_path: Path) -> None:
    """The GPU run: killed while the Trainer wrote checkpoint-280's weights, after its config files (closed)."""
    store, ckpt, said = MemoryStore(), tmp_path / "ckpt", list[str]()
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append, step=lambda: 260)
    for step in (240, 260):
        write_trainer_save(ckpt, step)
    sync.sync()
    write_trainer_save(ckpt, 280, upto=3)  # config.json, generation_config.json; model.safetensors open at the kill
    sync.sync(final=True, leave_out={"checkpoint-280/model.safetensors": OPEN})
    assert not [rel for rel in manifests(store)[-1]["files"] if "280" in rel]  # type: ignore[attr-defined]
    restored = restore(store, tmp_path / "r")
    assert {rel.split("/")[0] for rel in restored} == {"checkpoint-240", "checkpoint-260"}, sorted(restored)
    assert resume_trainer(tmp_path / "r") == 260
    [line] = said
    assert re.fullmatch(r"checkpoint checkpoint-280/ left out: being written \(model\.safetensors: open for writing"
                        r" when the job's processes were stopped, so it may be half-written\); checkpoint-260/"
                        r" \(whole, step 260, \d+ s old\) stays", line), line


def test_a_periodic_sync_never_names_a_half_save(tmp_path: Path) -> None:
    store, ckpt = MemoryStore(), tmp_path / "ckpt"
    sync = CheckpointSync(store, ckpt, PREFIX, writers=set)  # nothing open: the files between two writes
    write_trainer_save(ckpt, 20)
    for upto in range(len(TRAINER_FILES)):
        write_trainer_save(ckpt, 40, upto)
        sync.sync()
        named = {rel for rel in manifests(store)[-1]["files"] if "40" in rel}  # type: ignore[attr-defined]
        assert not named, f"{upto} of its files written: {sorted(named)}"
    write_trainer_save(ckpt, 40)
    sync.sync()
    restore(store, tmp_path / "whole")
    assert resume_trainer(tmp_path / "whole") == 40


class Rotating(MemoryStore):
    """A store whose upload of a file runs the job's rotation first (`rotate(path)`) when asked to: the file is gone
    by the time the upload reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.rotate: Callable[[Path], None] = lambda path: None

    def upload_file(self, key: str, path: Path, *args: object, **kw: object) -> str:  # type: ignore[override]
        self.rotate(path)
        return super().upload_file(key, path)


def test_a_save_rotated_away_during_its_upload_is_a_deletion_and_the_newest_whole_one_stays(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """save_total_limit=1 with uploads slower than saves: checkpoint-280 goes while it is uploaded (the Trainer wrote
    300 and rotated 280 away), and 300 is still being written. The bucket keeps 260, which the job deleted long ago,
    until a newer whole save is named; no line says anything failed."""
    caplog.set_level(logging.WARNING, logger="jobplane.agent")
    store, ckpt, said = Rotating(), tmp_path / "ckpt", list[str]()
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append, writers=set, overdue_after=3600)
    write_trainer_save(ckpt, 260)
    sync.sync()
    write_trainer_save(ckpt, 280)
    shutil.rmtree(ckpt / "checkpoint-260")

    def rotation(path: Path) -> None:
        if "checkpoint-280" in str(path):
            write_trainer_save(ckpt, 300, upto=4)  # its next save begins, and 280 goes
            shutil.rmtree(ckpt / "checkpoint-280", ignore_errors=True)

    store.rotate = rotation
    moved = sync.sync()
    assert not moved.failed and not said
    assert not [r.getMessage() for r in caplog.records], "a deletion is no failure: no retry, no line"
    assert sorted({rel.split("/")[0] for rel in manifests(store)[-1]["files"]}) == ["checkpoint-260"]  # type: ignore
    restore(store, tmp_path / "r")
    assert resume_trainer(tmp_path / "r") == 260

    store.rotate = lambda path: None
    write_trainer_save(ckpt, 300)  # whole now: it replaces 260 in the bucket
    sync.sync()
    assert sorted({rel.split("/")[0] for rel in manifests(store)[-1]["files"]}) == ["checkpoint-300"]  # type: ignore
    assert {i.key.split("/")[6] for i in store.list(PREFIX + "files/")} == {"checkpoint-300"}


def test_each_rank_judges_its_own_saves_after_a_restore_of_every_ranks(tmp_path: Path) -> None:
    """A two-node Trainer job (its DeepSpeed integration): node 0 writes the Trainer's files, node 1 its own shard
    only. A rerun restores the union onto both; the next save of each is whole by its own files alone."""
    store = MemoryStore()

    def node(rank: int, attempt: int) -> tuple[CheckpointSync, Path]:
        ckpt = tmp_path / f"a{attempt}-rank{rank}"
        return CheckpointSync(store, ckpt, PREFIX, rank=rank, attempt=attempt, writers=set), ckpt

    def save(ckpt: Path, rank: int, step: int) -> None:
        if rank == 0:
            write_trainer_save(ckpt, step)
        shard = ckpt / f"checkpoint-{step}" / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.write_text(f"step {step}\n")

    for rank in (0, 1):
        sync, ckpt = node(rank, 1)
        save(ckpt, rank, 20)
        sync.sync()
    for rank in (0, 1):
        sync, ckpt = node(rank, 2)
        sync.restore()
        assert (ckpt / "checkpoint-20" / "trainer_state.json").exists()  # the union, on node 1 too
        save(ckpt, rank, 40)
        sync.sync()
        named = [m for m in manifests(store, rank) if m["attempt"] == 2 and any(
            rel.startswith("checkpoint-40/") for rel in m["files"])]  # type: ignore[attr-defined]
        assert named, f"rank {rank}'s checkpoint-40 is never named"
        mine = {rel for rel in named[-1]["files"] if rel.startswith("checkpoint-40/")}  # type: ignore[attr-defined]
        assert (f"checkpoint-40/global_step40/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" in mine
                and len(mine) == (len(TRAINER_FILES) + 1 if rank == 0 else 1)), mine


def test_a_half_save_an_older_agent_named_is_not_restored(tmp_path: Path) -> None:
    """A job preempted under an agent that kept checkpoint-280's two closed files resumes, under this one, from 260."""
    store, ckpt, said = MemoryStore(), tmp_path / "old", list[str]()
    write_trainer_save(ckpt, 260)
    write_trainer_save(ckpt, 280, upto=2)
    files = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        rel, data = path.relative_to(ckpt).as_posix(), path.read_bytes()
        key = f"files/0/00000001-a1/{rel}"
        files[rel] = {"key": key, "size": len(data), "version": store.put(PREFIX + key, data)}
    store.put(PREFIX + "manifests/0/00000001.json", json.dumps(
        {"seq": 1, "rank": 0, "attempt": 1, "written_at": "2026-11-27T10:00:00+00:00", "step": 280,
         "files": files}).encode())
    CheckpointSync(store, tmp_path / "r", PREFIX, attempt=2, say=said.append).restore()
    assert resume_trainer(tmp_path / "r") == 260
    assert said == ["checkpoint checkpoint-280/ not restored: not finished: trainer_state.json is not there yet (the"
                    " Hugging Face Trainer writes it last); the whole saves before it are"]
    assert not [rel for rel in manifests(store)[-1]["files"] if "280" in rel]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("save", "stays", "writing", "stands"), [
    ("checkpoint-45", "checkpoint-30", ("config.json", "generation_config.json", ".tmpWYajo3"), "model.safetensors"),
    ("step-330", "step-315", ("tmpk3_x9q2a",), "a file"),  # its predecessor's two files missing: neither is sure
], ids=["trainer-safetensors", "dcp"])
def test_the_log_names_a_saves_own_step_and_a_temp_file_by_what_it_stands_for(
        tmp_path: Path, save: str, stays: str, writing: tuple[str, ...], stands: str) -> None:
    """Issue 64: the step was the one the job's output showed when the sync that uploaded the save began (45, where
    the Trainer resumed at 30), and safetensors' `.tmpWYajo3` (renamed to model.safetensors once written) was named
    as it was."""
    store, ckpt, said = MemoryStore(), tmp_path / "ckpt", list[str]()
    sync = CheckpointSync(store, ckpt, PREFIX, say=said.append, step=lambda: 345, writers=set)
    older = {"checkpoint-45": "checkpoint-15", "step-330": "step-300"}[save]
    for directory in (older, stays):
        if save.startswith("checkpoint"):
            write_trainer_save(ckpt, int(directory.split("-")[1]))
        else:
            for name in ("__0_0.distcp", ".metadata"):
                (ckpt / directory).mkdir(parents=True, exist_ok=True)
                (ckpt / directory / name).write_text(directory)
    sync.sync()
    (ckpt / save).mkdir()
    for name in writing:
        (ckpt / save / name).write_text("partly")
    sync.sync(final=True, leave_out={f"{save}/{writing[-1]}": OPEN})
    number = stays.rpartition("-")[2]
    temp = re.escape(writing[-1])
    assert re.fullmatch(rf"checkpoint {save}/ left out: {stands} \(being written as {temp}: {OPEN}\); {stays}/"
                        rf" \(whole, step {number}, \d+ s old\) stays", said[0]), said
