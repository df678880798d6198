"""Two lives of one checkpoint rank (F6): a rerun starts attempt 2 while attempt 1's rank still runs its final
sync. Before, both wrote files/<rank>/<seq>/ with the same seq and each cleaned the other's objects: attempt 2
resumed from an older step, and the newest manifest named a deleted object, so every later restore failed."""

from __future__ import annotations

import json
from pathlib import Path

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.clouds.memory import MemoryStore
from jobplane.decide.model import Rule
from tests.agent.test_checkpoints import PREFIX, restore
from tests.reconcile.day import Day, day  # noqa: F401  (the fixture)


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


def test_a_rerun_ends_the_preempted_attempts_surviving_ranks_with_the_relaunch(day: Day) -> None:  # noqa: F811
    day.started("pair", spot="true", num_nodes=2)  # 12:00 launched, 12:01 RUNNING
    day.at("12:30")
    day.preempted("pair", rank=0)  # rank 0 got the notice; rank 1's VM runs on
    outcomes = day.rerun(jobs=["pair"])
    assert [(o.action.rule, o.result) for o in outcomes] == [(Rule.RERUN, "applied")]
    assert day.vms("pair") == {1: ["shutting-down", "shutting-down"], 2: ["pending", "pending"]}
