"""Who may be admitted (jobplane.decide.admission): an attempt fits a quota or waits in its queue with the figures,
no later job passes an earlier one, a freed slot admits the waiting in order, a job's later attempt takes its
earlier one's place, a second admission of the same attempt writes nothing, and only a reservation (or a wait) no
live job keeps is reclaimed, past the grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobplane.decide.admission import RESERVATION_GRACE, Full, Quota, admit, fair_order, next_up, reclaimable
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
