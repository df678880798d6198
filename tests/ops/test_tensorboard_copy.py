"""`jobplane tensorboard`'s local copy: one run per job and attempt (another rank's apart), only what changed
fetched again, a grown event file appended to in place (a reader's open file sees the new records), a rewritten
one rewritten in place, and a key that would leave its run skipped, said once, while the copy goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobplane.clouds.memory import MemoryStore
from jobplane.model import keys
from jobplane.ops.tensorboard import LocalRuns, local_path, run_name
from jobplane.store.registry import Registry
from tests.helpers import data_of

EVENTS = "events.out.tfevents.1700000000.host"


def put(reg: Registry, job_id: str, attempt: int, rank: int, rel: str, data: bytes) -> None:
    reg.put(keys.tensorboard_prefix(data_of(reg, job_id), attempt, rank) + rel, data)


def test_runs_per_job_and_attempt_and_only_changes_fetched_again(tmp_path: Path) -> None:
    reg = Registry(MemoryStore(), "root")
    put(reg, "lr-a", 1, 0, EVENTS, b"attempt 1")
    put(reg, "lr-a", 2, 0, EVENTS, b"attempt 2")
    put(reg, "lr-a", 2, 1, f"eval/{EVENTS}", b"rank 1")
    put(reg, "lr-b", 1, 0, EVENTS, b"other job")
    copy = LocalRuns(reg, tmp_path, [data_of(reg, "lr-a"), data_of(reg, "lr-b")])
    first = copy.sync()
    assert first.runs == {"lr-a/attempt-1", "lr-a/attempt-2", "lr-a/attempt-2-rank-1", "lr-b/attempt-1"}
    assert (tmp_path / "lr-a" / "attempt-2-rank-1" / "eval" / EVENTS).read_bytes() == b"rank 1"
    assert (first.files, first.bytes) == (4, 33)
    assert copy.sync().files == 0

    held = tmp_path / "lr-a" / "attempt-2" / EVENTS
    with held.open("rb") as reader:  # TensorBoard reading the file, from where it stopped
        assert reader.read() == b"attempt 2"
        put(reg, "lr-a", 2, 0, EVENTS, b"attempt 2 and more")
        grown = copy.sync()
        assert (grown.files, grown.bytes) == (1, 9)  # only the new bytes written
        assert reader.read() == b" and more"  # same file: the reader goes on

        put(reg, "lr-a", 2, 0, EVENTS, b"rewritten")  # not a longer version: rewritten whole, still in place
        assert copy.sync().bytes == 9
        reader.seek(0)
        assert reader.read() == b"rewritten"


def test_a_key_that_would_leave_its_run_is_skipped_once_and_the_copy_goes_on(tmp_path: Path) -> None:
    reg = Registry(MemoryStore(), "root")
    put(reg, "evil", 1, 0, "../../outside", b"x")
    put(reg, "evil", 1, 0, EVENTS, b"its own run")
    put(reg, "good", 1, 0, EVENTS, b"another job")
    copy = LocalRuns(reg, tmp_path / "copy", [data_of(reg, "evil"), data_of(reg, "good")])
    first = copy.sync()
    assert len(first.refused) == 1 and "outside" in first.refused[0]
    assert first.files == 2 and (tmp_path / "copy" / "good" / "attempt-1" / EVENTS).read_bytes() == b"another job"
    assert not (tmp_path / "outside").exists()
    put(reg, "good", 1, 0, EVENTS, b"another job, grown")
    later = copy.sync()
    assert later.refused == [] and later.files == 1  # said once; the other jobs still followed
    with pytest.raises(ValueError, match="outside"):
        local_path(tmp_path, "evil", 1, 0, "../x")
    assert run_name("evil", 3, 0) == "evil/attempt-3"
