"""Two lives of one checkpoint rank (F6): a rerun starts attempt 2 while attempt 1's rank still runs its final
sync. Before, both wrote files/<rank>/<seq>/ with the same seq and each cleaned the other's objects: attempt 2
resumed from an older step, and the newest manifest named a deleted object, so every later restore failed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.clouds.memory import MemoryStore
from jobplane.decide.model import Rule
from tests.agent.test_checkpoints import PREFIX, restore
from tests.control.reconcile.day import Day


def save(local: Path, step: int) -> None:
    """torch.save in place, as training scripts do, plus a file that never changes."""
    (local / "state.pt").write_text(f"step {step}")
    (local / "config.json").write_text('{"lr": 0.1}')


def missing(store: MemoryStore) -> list[str]:
    """Objects some manifest names that are not in the bucket."""
    present = {info.key for info in store.list(PREFIX)}
    out = []
    for info in store.list(PREFIX + "manifests/"):
        for entry in json.loads(store.get(info.key).data)["files"].values():
            if PREFIX + entry["key"] not in present:
                out.append(f"{info.key} names {entry['key']}")
    return out


def test_two_lives_of_one_rank_never_corrupt_each_others_manifests(tmp_path: Path) -> None:
    store = MemoryStore()
    one, two = tmp_path / "attempt1", tmp_path / "attempt2"
    one.mkdir()
    first = CheckpointSync(store, one, PREFIX, attempt=1, settle=0.0)
    for step in (100, 150):
        save(one, step)
        first.sync()

    second = CheckpointSync(store, two, PREFIX, attempt=2, settle=0.0)  # the rerun's VM restores ...
    second.restore()
    assert (two / "state.pt").read_text() == "step 150"
    save(one, 200)  # ... while attempt 1's survivor saves once more and syncs on its SIGTERM
    save(two, 151)
    second.sync()
    first.sync(final=True)
    save(two, 152)
    second.sync()

    assert missing(store) == [], "no manifest names a deleted object"
    assert restore(store, tmp_path / "attempt3") == {"config.json": b'{"lr": 0.1}', "state.pt": b"step 152"}


@pytest.mark.parametrize("reads_job", [True, False], ids=["reads-job-json", "job-json-unreadable"])
def test_a_survivors_final_sync_after_the_rerun_restored_never_deletes_what_the_rerun_names(
        tmp_path: Path, reads_job: bool) -> None:
    """Issue 44's order: attempt 2 restores manifest 1 and writes nothing yet; attempt 1's survivor saves step 200
    on its SIGTERM and cleans; attempt 2's next manifest names the latest.pt it restored. Before, that object was
    gone and every later restore failed. Whether the survivor can read that the job moved on (job.json) or not,
    attempt 2's restore announced it stands on those objects."""
    store = MemoryStore()
    one, two = tmp_path / "attempt1", tmp_path / "attempt2"
    one.mkdir()
    job_attempt = [1]  # job.json's attempt as the lives read it

    def moved_on(attempt: int) -> bool:
        return reads_job and job_attempt[0] > attempt

    first = CheckpointSync(store, one, PREFIX, attempt=1, settle=0.0, superseded=lambda: moved_on(1))
    (one / "latest.pt").write_text("step 100")
    first.sync()  # manifest 1 names files/0/00000001-a1/latest.pt
    job_attempt[0] = 2  # the rerun's claim, before its VM boots
    second = CheckpointSync(store, two, PREFIX, attempt=2, settle=0.0, superseded=lambda: moved_on(2))
    second.restore()
    (one / "latest.pt").write_text("step 200")
    first.sync(final=True)  # the survivor's final sync: step 200, and its clean-up
    (two / "epoch-1.pt").write_text("attempt 2 progress")
    second.sync()

    assert missing(store) == [], "no manifest names a deleted object"
    third = restore(store, tmp_path / "attempt3")
    assert third in ({"latest.pt": b"step 200"}, {"latest.pt": b"step 100", "epoch-1.pt": b"attempt 2 progress"})


def test_restored_objects_a_racing_delete_took_are_uploaded_again_before_they_are_named(tmp_path: Path) -> None:
    """A survivor's delete that raced the restore (it listed before the rerun announced itself): attempt 2's
    first manifest does not name the object it restored from; it uploads its own copy."""
    store = MemoryStore()
    one, two = tmp_path / "attempt1", tmp_path / "attempt2"
    one.mkdir()
    (one / "latest.pt").write_text("step 100")
    CheckpointSync(store, one, PREFIX, attempt=1, settle=0.0).sync()
    said: list[str] = []
    second = CheckpointSync(store, two, PREFIX, attempt=2, settle=0.0, say=said.append)
    second.restore()
    [old] = [i.key for i in store.list(PREFIX + "files/") if "-a1/" in i.key]
    store.delete(old)  # the survivor's delete lands now
    (two / "epoch-1.pt").write_text("attempt 2 progress")
    second.sync()
    assert missing(store) == []
    assert restore(store, tmp_path / "attempt3") == {"latest.pt": b"step 100", "epoch-1.pt": b"attempt 2 progress"}
    assert any("deleted from the bucket meanwhile" in line for line in said)


def test_a_manifest_naming_a_missing_object_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    """Whatever left it (a bucket written before the fix, a hand-deleted object): the restore takes the newest
    manifest it can restore whole, says so, and the job goes on instead of failing at every attempt."""
    store = MemoryStore()
    one = tmp_path / "attempt1"
    one.mkdir()
    life = CheckpointSync(store, one, PREFIX, attempt=1, settle=0.0)
    (one / "latest.pt").write_text("step 100")
    life.sync()
    dangling = json.loads(store.get(PREFIX + "manifests/0/00000001.json").data)
    dangling["seq"], dangling["files"]["latest.pt"]["key"] = 2, "files/0/00000002-a2/latest.pt"
    store.put(PREFIX + "manifests/0/00000002.json", json.dumps(dangling).encode())
    said: list[str] = []
    CheckpointSync(store, tmp_path / "attempt3", PREFIX, attempt=3, say=said.append).restore()
    assert (tmp_path / "attempt3" / "latest.pt").read_text() == "step 100"
    assert said == ["checkpoint manifest 0/00000002 names 1 missing objects (e.g. latest.pt): restoring the one"
                    " before it"]


class Lives:
    """Two lives of rank 0 and a random order of what they do: attempt 1 trains and syncs until its final sync;
    the rerun's claim moves the job to attempt 2; attempt 2 restores, then trains and syncs."""

    def __init__(self, tmp: Path, rng: random.Random) -> None:
        self.store, self.rng, self.job_attempt = MemoryStore(), rng, 1
        self.local = {1: tmp / "a1", 2: tmp / "a2"}
        self.local[1].mkdir(parents=True)
        self.lives = {n: CheckpointSync(self.store, self.local[n], PREFIX, attempt=n, settle=0.0, writers=set,
                                        superseded=lambda n=n: self.job_attempt > n) for n in (1, 2)}  # type: ignore[misc]
        self.step = {1: 0, 2: 0}
        self.written: dict[str, set[bytes]] = {}  # every version of every file any life saved
        self.ended, self.restored = False, False

    def save(self, n: int) -> None:
        """torch.save in place of the state, sometimes a rotating epoch file, sometimes a file deleted."""
        self.step[n] += 1
        self._write(n, "state.pt", f"a{n} step {self.step[n]}")
        if self.rng.random() < 0.4:
            self._write(n, f"epoch-{self.step[n] % 3}.pt", f"a{n} epoch at {self.step[n]}")
        if self.rng.random() < 0.2 and (extra := sorted(self.local[n].glob("epoch-*"))):
            self.rng.choice(extra).unlink()

    def _write(self, n: int, name: str, text: str) -> None:
        (self.local[n] / name).write_text(text)
        self.written.setdefault(name, set()).add(text.encode())

    def moves(self) -> list[str]:
        can = []
        if not self.ended:
            can += ["save 1", "sync 1", "final 1"]
        if self.job_attempt == 1:
            can.append("claim")
        elif not self.restored:
            can.append("restore 2")
        else:
            can += ["save 2", "sync 2"]
        return can

    def do(self, move: str) -> None:
        what, _, n = move.partition(" ")
        if what == "claim":
            self.job_attempt = 2
        elif what == "restore":
            self.local[2].mkdir(parents=True)
            self.lives[2].restore()
            self.restored = True
            self.step[2] = max((int(t.rsplit(" ", 1)[1]) for t in [self._read(2, "state.pt")] if t), default=0)
        elif what == "save":
            self.save(int(n))
        elif what == "sync":
            self.lives[int(n)].sync()
        else:
            self.lives[1].sync(final=True)
            self.ended = True

    def _read(self, n: int, name: str) -> str:
        path = self.local[n] / name
        return path.read_text() if path.exists() else ""


def test_two_lives_in_any_order_leave_a_newest_manifest_that_restores_whole(tmp_path: Path) -> None:
    """Hundreds of random interleavings of two lives' restore, saves, syncs and final sync: after every move no
    manifest names a missing object, and a third life restores whole files some life saved."""
    for seed in range(300):
        rng = random.Random(seed)
        lives = Lives(tmp_path / str(seed), rng)
        done = []
        for _ in range(rng.randint(6, 24)):
            move = rng.choice(lives.moves())
            lives.do(move)
            done.append(move)
            assert missing(lives.store) == [], f"seed {seed} after {done}"
        got = restore(lives.store, tmp_path / str(seed) / "a3")
        assert all(data in lives.written[name] for name, data in got.items()), f"seed {seed}: {done} gave {got}"


def test_a_rerun_ends_the_preempted_attempts_surviving_ranks_with_the_relaunch(day: Day) -> None:
    day.started("pair", spot="true", num_nodes=2)  # 12:00 launched, 12:01 RUNNING
    day.at("12:30")
    day.preempted("pair", rank=0)  # rank 0 got the notice; rank 1's VM runs on
    outcomes = day.rerun(jobs=["pair"])
    assert [(o.action.rule, o.result) for o in outcomes] == [(Rule.RERUN, "applied")]
    assert day.vms("pair") == {1: ["shutting-down", "shutting-down"], 2: ["pending", "pending"]}
