"""Fair share under the deployment's cap (issue 40), through a day on the manual clock: when max_active_instances
binds, the job a freed slot admits comes from the owner holding the fewest nodes per its policy weight (Kueue's
fair sharing, Slurm's fair-share factor), each owner's own line in its order. On main the cap did not exist; with
only the owners' lines, the owner whose record lists first took every freed slot."""

from __future__ import annotations

import pytest

from jobplane.model import keys
from jobplane.model.states import State
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


def test_a_dependent_released_by_its_after_waits_its_owners_turn(day: Day) -> None:
    """Issue 58: a job its `after:` held, released by its dependency's end, took the freed slot straight from the
    deployment's cap on main, before the owners' lines were weighed: research kept 2 of 3 slots while vision waited.
    Now its admission goes through the same weighted order as every other: vision, at 1 node of its weight 2, is
    further below its share than research at 1 of 1."""
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 3\nmax_active_instances: 3\n"
                             b"owner_weights: {vision: 2, research: 1}\n")
    assert [day.drop("research", "r1"), day.drop("research", "r2"), day.drop("vision", "v1")] == ["launched"] * 3
    assert day.drop("research", "r3", spec="after: [r1]\n") == "waiting"
    day.at("12:01")
    assert day.drop("vision", "v2") == "waiting"
    assert day.ends("r1", "12:10") == ["v2"]
    r3 = day.job("r3")
    assert r3.state == State.WAITING_CAPACITY and "v2 of owner 'vision'" in (r3.reason or ""), r3.reason
    assert day.ends("r2", "12:20") == ["r3"], "research's turn once vision holds its share"


def test_a_big_job_first_by_fair_share_keeps_the_freed_nodes_against_another_owners_stream(day: Day) -> None:
    """Issue 58: team-a's 4-node job is first by fair share (team-a holds nothing), so the nodes team-b's jobs free
    are kept for it (a reservation, as Slurm's backfill makes for the job at the head of its queue) until it fits. On
    main each new 1-node drop of team-b took a freed node (the deployment's record had no queue), and after 8 hours
    team-a still held none."""
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 4\nmax_active_instances: 4\n")
    assert [day.drop("team-b", f"b{n}") for n in (1, 2, 3, 4)] == ["launched"] * 4
    day.at("12:01")
    assert day.drop("team-a", "big", spec="num_nodes: 4\n") == "waiting"
    for n, hhmm in ((1, "12:10"), (2, "12:20"), (3, "12:30")):
        assert day.ends(f"b{n}", hhmm) == []
        day.clock.advance(60)
        assert day.drop("team-b", f"b{n + 4}") == "waiting", "the freed nodes are big's"
    assert day.job("b5").reason == ("the deployment's 1 free node is kept for big of owner 'team-a', which needs 4 "
                                    "and goes first by fair share; 3 of 4 nodes in use (max_active_instances)")
    assert day.ends("b4", "12:40") == ["big"]
