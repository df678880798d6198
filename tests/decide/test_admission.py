"""Who may be admitted (jobplane.decide.admission): an attempt fits a quota or waits in its queue with the figures,
no later job passes an earlier one, a freed slot admits the waiting in order, a job's later attempt takes its
earlier one's place, a second admission of the same attempt writes nothing, and only a reservation (or a wait) no
live job keeps is reclaimed, past the grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobplane.decide.admission import (
    RESERVATION_GRACE,
    Full,
    Quota,
    admit,
    fair_order,
    never_fits,
    next_up,
    reclaimable,
    requeue,
    seeded,
    turn,
    walk,
)
from jobplane.model.admission import AdmissionRecord, Reservation

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
QUOTA = Quota(4, "owner 'team-a'", "max_active_instances_per_owner")


def held(job_id: str, nodes: int = 1, attempt: int = 1, at: datetime = NOW) -> Reservation:
    return Reservation(job_id=job_id, attempt=attempt, owner="team-a", nodes=nodes, at=at)


def record(*reservations: Reservation) -> AdmissionRecord:
    return AdmissionRecord(reservations=reservations)


LATER = NOW + timedelta(minutes=1)


def waits(job_id: str, nodes: int = 1, submitted: datetime = NOW, attempt: int = 1) -> Reservation:
    return Reservation(job_id=job_id, attempt=attempt, owner="team-a", nodes=nodes, at=NOW, submitted=submitted)


@pytest.mark.parametrize(("before", "want", "after", "full"), [
    pytest.param(record(), held("a", 4), record(held("a", 4)), None, id="an empty quota takes all it has"),
    pytest.param(record(held("a", 2)), held("b", 2), record(held("a", 2), held("b", 2)), None,
                 id="exactly the quota: admitted"),
    pytest.param(record(held("a", 3)), waits("b", 2), AdmissionRecord(reservations=(held("a", 3),),
                                                                      waiting=(waits("b", 2),)),
                 "owner 'team-a' has 3 active instances; 2 more would exceed the quota of 4 "
                 "(max_active_instances_per_owner)", id="one node over: waits in the queue, with the figures"),
    pytest.param(AdmissionRecord(reservations=(held("a", 3),), waiting=(waits("b", 2),)), waits("b", 2), None,
                 "owner 'team-a' has 3 active instances; 2 more would exceed the quota of 4 "
                 "(max_active_instances_per_owner)", id="still over: nothing to write"),
    pytest.param(AdmissionRecord(reservations=(held("a", 2),), waiting=(waits("b", 4),)), waits("c", 1, LATER),
                 AdmissionRecord(reservations=(held("a", 2),), waiting=(waits("b", 4), waits("c", 1, LATER))),
                 "1 earlier job of owner 'team-a' waits first (b next); 2 of 4 nodes in use "
                 "(max_active_instances_per_owner)", id="a later job that would fit waits behind an earlier one"),
    pytest.param(AdmissionRecord(reservations=(held("a", 2),), waiting=(waits("c", 1, LATER),)), waits("b", 2),
                 AdmissionRecord(reservations=(held("a", 2), waits("b", 2)), waiting=(waits("c", 1, LATER),)), None,
                 id="an earlier job is admitted past later waiters"),
    pytest.param(record(held("a", 4)), held("a", 4, attempt=2), record(held("a", 4, attempt=2)), None,
                 id="a later attempt takes the place of its job's earlier one"),
    pytest.param(record(held("a", 4)), held("a", 4, at=NOW + timedelta(minutes=5)), None, None,
                 id="the same attempt again (a resumed launch, a resent write): nothing to write"),
])
def test_admit(before: AdmissionRecord, want: Reservation, after: AdmissionRecord | None, full: str | None) -> None:
    assert admit(before, want, QUOTA) == (after, Full(full) if full else None)


def test_the_deployments_cap_keeps_no_queue() -> None:
    cap = Quota(6, "the deployment", "max_active_instances", queue=False)
    assert admit(record(held("a", 6)), held("b"), cap) == (None, Full(
        "the deployment has 6 active instances; 1 more would exceed the quota of 6 (max_active_instances)"))


def test_a_freed_slot_admits_the_waiting_in_order_up_to_the_first_that_does_not_fit() -> None:
    queue = AdmissionRecord(reservations=(held("a", 1),), waiting=(
        waits("d", 1, LATER + timedelta(minutes=1)), waits("c", 2, LATER), waits("b", 1)))
    assert [w.job_id for w in next_up(queue, QUOTA)] == ["b", "c"]
    assert next_up(queue.without({"a"}), QUOTA) == [waits("b", 1), waits("c", 2, LATER),
                                                    waits("d", 1, LATER + timedelta(minutes=1))]
    assert next_up(AdmissionRecord(reservations=(held("a", 2),), waiting=(waits("b", 3), waits("c", 1, LATER))),
                   QUOTA) == [], "strict order: the small job behind a big one waits"


def test_only_a_reservation_no_live_job_holds_is_reclaimed_and_only_past_the_grace() -> None:
    old = NOW - timedelta(seconds=RESERVATION_GRACE)
    holding = AdmissionRecord(reservations=(
        held("live", at=old), held("crashed", at=old), held("waits-now", at=old),
        held("just-admitted", at=NOW - timedelta(seconds=RESERVATION_GRACE - 1))), waiting=(
        held("waits", at=old), held("cancelled", at=old)))
    assert reclaimable(holding, {"live"}, {"live", "waits", "waits-now"}, NOW) == {"crashed", "waits-now", "cancelled"}


def test_fair_share_takes_from_the_owner_holding_the_fewest_nodes_per_weight_while_the_cap_has_room() -> None:
    def line(owner: str, held_nodes: int, *waiting: str) -> AdmissionRecord:
        return AdmissionRecord(
            reservations=(Reservation(job_id=f"{owner}-run", attempt=1, owner=owner, nodes=held_nodes, at=NOW),),
            waiting=tuple(Reservation(job_id=j, attempt=1, owner=owner, nodes=1, at=NOW,
                                      submitted=NOW + timedelta(seconds=n)) for n, j in enumerate(waiting)))

    lines = [line("team-a", 3, "a1", "a2"), line("team-b", 1, "b1", "b2", "b3")]
    quota = Quota(8, "", "max_active_instances_per_owner")
    assert [w.job_id for w in fair_order(lines, quota, lambda o: 1.0, free=4)] == ["b1", "b2", "a1", "b3"]
    assert [w.job_id for w in fair_order(lines, quota, lambda o: 3.0 if o == "team-a" else 1.0, free=3)] == [
        "a1", "b1", "a2"]
    assert [w.job_id for w in fair_order(lines, quota, lambda o: 1.0, free=0)] == []
    assert len(fair_order(lines, quota, lambda o: 1.0, free=None)) == 5, "no cap: every owner's next ones"


def test_a_full_instance_family_ends_only_its_owners_turn() -> None:
    def line(owner: str, held_nodes: int, *waiting: tuple[str, str]) -> AdmissionRecord:
        return AdmissionRecord(
            reservations=(Reservation(job_id=f"{owner}-run", attempt=1, owner=owner, nodes=held_nodes, at=NOW),),
            waiting=tuple(Reservation(job_id=j, attempt=1, owner=owner, nodes=1, at=NOW, families=(f,),
                                      submitted=NOW + timedelta(seconds=n)) for n, (j, f) in enumerate(waiting)))

    lines = [line("team-a", 1, ("a1", "p4d"), ("a2", "g5")), line("team-b", 2, ("b1", "g5"), ("b2", "p4d"))]
    quota = Quota(8, "", "max_active_instances_per_owner")
    assert [w.job_id for w in fair_order(lines, quota, lambda o: 1.0, None, {"p4d": 0, "g5": 4})] == ["b1"], \
        "a1 finds p4d full: team-a's strict line waits, team-b's g5 job goes; b2 finds p4d full"
    assert [w.job_id for w in fair_order(lines, quota, lambda o: 1.0, None, {"p4d": 1, "g5": 1})] == ["a1", "b1"], \
        "a1 takes p4d's node, a2 then finds g5's taken by b1 (team-b's turn after team-a's one), b2 p4d's"


CAP = Quota(4, "the deployment", "max_active_instances", queue=False)


def of(owner: str, job_id: str, nodes: int = 1, minute: int = 0, families: tuple[str, ...] = ()) -> Reservation:
    return Reservation(job_id=job_id, attempt=1, owner=owner, nodes=nodes, at=NOW, families=families,
                       submitted=NOW + timedelta(minutes=minute))


def test_the_deployments_turn_admits_by_fair_share_and_keeps_free_nodes_for_the_job_first_in_it() -> None:
    holding = AdmissionRecord(reservations=(of("team-b", "b1"), of("team-b", "b2"), of("team-b", "b3")))
    assert turn(holding, of("team-b", "b4", minute=5), CAP, lambda o: 1.0) == (
        holding.holding(of("team-b", "b4", minute=5)), None), "room, and nobody else waits"
    big = of("team-a", "big", nodes=4, minute=1)
    with_big = holding.queued(big)
    new, full = turn(with_big, of("team-b", "b5", minute=5), CAP, lambda o: 1.0)
    assert full == Full("the deployment's 1 free node is kept for big of owner 'team-a', which needs 4 and goes "
                        "first by fair share; 3 of 4 nodes in use (max_active_instances)")
    assert new is not None and [w.job_id for w in new.waiting] == ["big", "b5"], "b5 waits in the order"
    assert turn(new, of("team-b", "b5", minute=5), CAP, lambda o: 1.0)[0] is None, "the same attempt: no write"
    small = with_big.without({"big"}).queued(of("team-a", "a1", minute=1))
    new, full = turn(small, of("team-b", "b5", minute=5), CAP, lambda o: 1.0)
    assert full is not None and full.ahead == (of("team-a", "a1", minute=1),), "a1's owner holds less: it goes first"
    assert full.reason == ("1 job goes first by fair share (a1 of owner 'team-a' next); 3 of 4 nodes in use "
                           "(max_active_instances)")
    shared = AdmissionRecord(reservations=(of("team-a", "a0"), of("team-b", "b1"), of("team-b", "b2")),
                             waiting=(of("team-a", "a1", minute=1),))
    assert turn(shared, of("team-b", "b5", minute=5), CAP, lambda o: 1.0)[1] is not None, "team-a holds 1, team-b 2"
    assert turn(shared, of("team-b", "b5", minute=5), CAP, lambda o: 10.0 if o == "team-b" else 1.0)[1] is None, \
        "team-b weighs 10: its 2 nodes are 0.2 of its share, team-a's 1 is 1"
    full_cap = AdmissionRecord(reservations=(of("team-b", "b1", nodes=4),))
    assert turn(full_cap, of("team-a", "a1"), CAP, lambda o: 1.0)[1] == Full(
        "the deployment has 4 active instances; 1 more would exceed the quota of 4 (max_active_instances)")


def test_the_walk_passes_a_job_whose_family_is_full_and_stops_at_one_the_free_nodes_cannot_take() -> None:
    waiting = [of("team-a", "a1", families=("p4d",)), of("team-a", "a2", minute=1), of("team-b", "b1", minute=2),
               of("team-c", "c1", nodes=3, minute=3)]
    go, stop = walk(waiting, {"team-b": 1}, lambda o: 1.0, free=2, room={"p4d": 0})
    assert go == [] and stop is not None and stop.job_id == "c1", \
        "a1's family is full: team-a's turn ends; team-c holds least, and c1's 3 nodes do not fit the 2 free"
    go, stop = walk(waiting, {"team-b": 1}, lambda o: 1.0, free=4, room={"p4d": 0})
    assert [w.job_id for w in go] == ["c1", "b1"] and stop is None


def test_a_job_a_later_cap_refuses_goes_back_to_its_place_in_its_owners_line() -> None:
    line = AdmissionRecord(reservations=(held("a"), waits("b")), waiting=(waits("c", submitted=LATER),))
    back = requeue(line, waits("b"), capped=True)[0]
    assert back is not None and back.reservations == (held("a"),)
    assert [w.job_id for w in back.queue()] == ["b", "c"] and back.waiter("b").capped  # type: ignore[union-attr]
    assert requeue(back, waits("b"), capped=True) == (None, None), "already back"


def test_a_job_the_policy_in_force_can_never_fit_is_named_with_the_field() -> None:
    from jobplane.model.policy import policy_from

    policy = policy_from({"max_active_instances_per_owner": 8, "max_active_instances": 6,
                          "max_active_by_family": {"p4d": 2}})
    assert never_fits(of("team-a", "a", nodes=6), policy) is None
    assert never_fits(of("team-a", "a", nodes=7), policy) == (
        "num_nodes: 7 nodes can never fit the deployment's cap of 6 active instances (max_active_instances), as the "
        "policy stands now")
    assert never_fits(of("team-a", "a", nodes=3).model_copy(update={"kinds": ("p4d",)}), policy) == (
        "num_nodes: 3 nodes can never fit the cap of family p4d of 2 active instances (max_active_by_family.p4d), as "
        "the policy stands now"), "a family capped after it was admitted counts too"


def test_a_cap_set_while_jobs_run_counts_what_the_owners_records_hold_once() -> None:
    before = of("team-a", "ran-before").model_copy(update={"kinds": ("t3",)})
    under = of("team-a", "on-its-way").model_copy(update={"capped": True, "families": ("t3",), "kinds": ("t3",)})
    owners = [AdmissionRecord(reservations=(before, under)), AdmissionRecord(reservations=(of("team-b", "b"),))]
    counted, adopted = seeded(AdmissionRecord(), owners)
    assert counted.complete and [r.job_id for r in counted.reservations] == ["ran-before", "b"]
    assert adopted == {"team-a": {"ran-before"}, "team-b": {"b"}}, "on-its-way writes its own reservation there"
    counted, adopted = seeded(AdmissionRecord(), owners, "t3")
    assert [r.job_id for r in counted.reservations] == ["ran-before"] and adopted == {"team-a": {"ran-before"}}
