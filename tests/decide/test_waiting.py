"""Why a job waits (jobplane.decide.waiting, issue 58): one wording for the launcher's record and every view, checked
in the admission's own order (the policy in force, the budget, the owner's line and quota, the families, the
deployment's cap and order), and the figures a queue's header shows. On main each view built its own reason from the
owner's record alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobplane.decide.waiting import FREE, usage, why
from jobplane.model.admission import AdmissionRecord, Reservation
from jobplane.model.policy import policy_from

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POLICY = policy_from({"max_active_instances_per_owner": 2, "max_active_instances": 3,
                      "max_active_by_family": {"p4d": 2}, "owner_weights": {"vision": 2},
                      "budgets": {"monthly_usd": {"nlp": 10}, "on_exceeded": "wait"}})


def job(owner: str, job_id: str, nodes: int = 1, minute: int = 0, **fields: object) -> Reservation:
    return Reservation(job_id=job_id, attempt=1, owner=owner, nodes=nodes, at=NOW,
                       submitted=NOW + timedelta(minutes=minute), **fields)  # type: ignore[arg-type]


def line(*held: Reservation, waiting: tuple[Reservation, ...] = ()) -> AdmissionRecord:
    return AdmissionRecord(reservations=held, waiting=waiting)


LATE = job("vision", "late", minute=5)


@pytest.mark.parametrize(("owner", "deployment", "families", "wanted", "said"), [
    pytest.param(line(), None, {}, job("vision", "huge", nodes=3),
                 "num_nodes: 3 nodes can never fit the owner quota of 2 active instances "
                 "(max_active_instances_per_owner), as the policy stands now", id="never fits, first of all"),
    pytest.param(line().charged("nlp", 10, NOW), None, {}, job("nlp", "new"),
                 "budget: $10.00 of $10.00 this month for nlp (budgets.monthly_usd)", id="its owner's budget"),
    pytest.param(line(waiting=(job("nlp", "held"),)).charged("nlp", 10, NOW), None, {},
                 job("nlp", "rerun", minute=5, ran=True), FREE,
                 id="a job that ran passes the budget and the jobs the budget holds"),
    pytest.param(line(waiting=(job("vision", "first"), LATE)), None, {}, LATE,
                 "1 earlier job of owner 'vision' waits first (first next); 0 of 2 nodes in use "
                 "(max_active_instances_per_owner)", id="behind in its owner's line"),
    pytest.param(line(job("vision", "v1", nodes=2)), None, {}, LATE,
                 "owner 'vision' has 2 active instances; 1 more would exceed the quota of 2 "
                 "(max_active_instances_per_owner)", id="its owner's quota"),
    pytest.param(line(), line(job("nlp", "n1", nodes=3)), {"p4d": line(job("nlp", "n1", nodes=2))},
                 job("vision", "p", families=("p4d",)),
                 "instance family 'p4d' has 2 active instances; 1 more would exceed the quota of 2 "
                 "(max_active_by_family.p4d)", id="a family's cap, before the deployment's"),
    pytest.param(line(), line(job("nlp", "n1", nodes=3)), {}, LATE,
                 "the deployment has 3 active instances; 1 more would exceed the quota of 3 (max_active_instances)",
                 id="the deployment's cap"),
    pytest.param(line(job("vision", "v1")), line(job("vision", "v1"), job("research", "r1"), waiting=(
        job("nlp", "n2", minute=1),)), {}, LATE,
        "1 job goes first by fair share (n2 of owner 'nlp' next); 2 of 3 nodes in use (max_active_instances)",
        id="the deployment's order: nlp holds nothing, vision 1 of its weight 2"),
    pytest.param(line(), line(), {}, LATE, FREE, id="nothing holds it: the next pass launches it"),
])
def test_why_checks_what_the_admission_checks_in_its_order(owner: AdmissionRecord, deployment: AdmissionRecord | None,
                                                            families: dict[str, AdmissionRecord], wanted: Reservation,
                                                            said: str) -> None:
    assert why(wanted, owner, POLICY, NOW, deployment=deployment, families=families) == said


def test_a_jobs_own_reservation_never_counts_against_it() -> None:
    holds = line(job("vision", "v1"), LATE)
    assert why(LATE, holds, POLICY, NOW, deployment=line(job("nlp", "n1"), LATE)) == FREE


def test_usage_gives_each_quota_its_holders_limit_and_line() -> None:
    owners = [line(job("vision", "v1", nodes=2), waiting=(LATE,)), line(job("nlp", "n1"))]
    held = usage(owners, POLICY, deployment=line(job("vision", "v1", nodes=2), job("nlp", "n1"), waiting=(LATE,)),
                 families={"p4d": line()})
    assert [h.as_dict() for h in held] == [
        {"name": "vision", "field": "max_active_instances_per_owner", "used": 2, "limit": 2, "waiting": 1,
         "weight": 2.0},
        {"name": "nlp", "field": "max_active_instances_per_owner", "used": 1, "limit": 2, "waiting": 0, "weight": 1.0},
        {"name": "deployment", "field": "max_active_instances", "used": 3, "limit": 3, "waiting": 1, "weight": None},
        {"name": "p4d", "field": "max_active_by_family.p4d", "used": 0, "limit": 2, "waiting": 0, "weight": None}]
