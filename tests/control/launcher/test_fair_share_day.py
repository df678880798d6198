"""Fair share under the deployment's cap (issue 40), through a day on the manual clock: when max_active_instances
binds, the job a freed slot admits comes from the owner holding the fewest nodes per its policy weight (Kueue's
fair sharing, Slurm's fair-share factor), each owner's own line in its order. On main the cap did not exist; with
only the owners' lines, the owner whose record lists first took every freed slot."""

from __future__ import annotations

import pytest

from jobplane.model import keys
from tests.control.reconcile.day import Day


@pytest.mark.parametrize(("weights", "after_a1", "after_a2"), [
    pytest.param("", ["b1"], ["b2"], id="equal weights: b until both hold 2"),
    pytest.param("owner_weights: {team-a: 3}\n", ["b1"], ["a5"], id="team-a weighs 3: its share is 2 of 3 nodes"),
])
def test_a_freed_slot_goes_to_the_owner_furthest_below_its_share(day: Day, weights: str, after_a1: list[str],
                                                                  after_a2: list[str]) -> None:
    day.reg.put(keys.POLICY, f"max_active_instances_per_owner: 4\nmax_active_instances: 4\n{weights}".encode())
    assert [day.drop("team-a", f"a{n}") for n in (1, 2, 3, 4)] == ["launched"] * 4
    day.at("12:01")
    assert [day.drop("team-b", f"b{n}") for n in (1, 2, 3)] == ["waiting"] * 3
    assert day.job("b1").reason == ("the deployment has 4 active instances; 1 more would exceed the quota of 4 "
                                    "(max_active_instances)")
    day.at("12:02")
    assert day.drop("team-a", "a5") == "waiting", "the cap is full"
    assert day.ends("a1", "12:10") == after_a1
    assert day.ends("a2", "12:20") == after_a2
