"""Budgets' pure parts (issue 40): an owner's spend this calendar month from its admission record, the levels it is
told at, the admission behind its budget, and the policy's fields with their bounds. On main none existed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobplane.decide import admission, budget
from jobplane.model.admission import AdmissionRecord, Reservation
from jobplane.model.errors import SpecError
from jobplane.model.policy import Policy, parse_policy, policy_from
from jobplane.model.usage import AttemptUsage, InstanceSpan

NOW = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
QUOTA = admission.Quota(4, "owner 'team-a'", "max_active_instances_per_owner")


def policy(on_exceeded: str = "refuse") -> Policy:
    return policy_from({"budgets": {"monthly_usd": {"team-a": 100}, "on_exceeded": on_exceeded}})


def held(job_id: str, attempt: int = 1, at: datetime = NOW, rate: float | None = 6.0) -> Reservation:
    return Reservation(job_id=job_id, attempt=attempt, owner="team-a", nodes=1, at=at, submitted=at, rate=rate)


def used(attempt: int, start: datetime, end: datetime | None, price: float | None = 6.0) -> AttemptUsage:
    return AttemptUsage(attempt=attempt, instance_type="t3.micro", market="on-demand", price=price,
                        instances=[InstanceSpan(id=f"i-{attempt}", start=start, end=end)])


def test_spend_is_this_months_ended_attempts_and_the_reservations_so_far() -> None:
    record = AdmissionRecord(reservations=(held("a", at=NOW - timedelta(hours=2)), held("b", rate=None)))
    record = record.charged("team-a", 40.0, NOW - timedelta(days=3))
    assert record.spend(NOW) == pytest.approx(40 + 12), "a's 2 h at $6; b has no known price"
    december = NOW + timedelta(hours=2)  # 01:00 on the 1st: November's $40 is not counted, a's hour of it is
    assert record.spend(december) == pytest.approx(6)
    assert record.charged("team-a", 5, december).model_dump(include={"month", "spent"}) == {
        "month": "2026-12", "spent": 5}


def test_levels_and_the_reason_carry_the_figures() -> None:
    spent = {50.0: budget.Level.OK, 80.0: budget.Level.WARNING, 100.0: budget.Level.EXCEEDED,
             512.0: budget.Level.EXCEEDED}
    for usd, level in spent.items():
        assert budget.Budget("team-a", usd, 100).level() == level
    over = budget.Budget("team-a", 512, 500)
    assert over.reason == "budget: $512.00 of $500.00 this month for team-a (budgets.monthly_usd)"
    assert over.figures == "$512.00 of $500.00 this month (102%)"
    assert budget.standing("team-b", AdmissionRecord(), policy(), NOW) is None, "no budget, no standing"


def spent_record() -> AdmissionRecord:
    return AdmissionRecord(waiting=(held("w"),)).charged("team-a", 100.0, NOW)


def test_an_owner_at_its_budget_has_its_new_job_refused_or_waiting_but_a_job_that_ran_goes_on() -> None:
    new, full = budget.admit(spent_record(), held("w"), QUOTA, policy=policy("refuse"), usage=[], now=NOW)
    assert full == admission.Full("budget: $100.00 of $100.00 this month for team-a (budgets.monthly_usd)",
                                  budget=True)
    assert new is not None and new.waiting == (), "refused: it leaves the line"
    new, full = budget.admit(spent_record(), held("x"), QUOTA, policy=policy("wait"), usage=[], now=NOW)
    assert full is not None and full.budget and new is not None and [w.job_id for w in new.waiting] == ["w", "x"]
    assert budget.admit(spent_record(), held("w"), QUOTA, policy=policy("wait"), usage=[], now=NOW)[0] is None, \
        "already waiting: nothing to write"
    rerun = budget.admit(spent_record().model_copy(update={"waiting": ()}), held("r", attempt=2), QUOTA,
                         policy=policy(), usage=[used(1, NOW - timedelta(hours=1), NOW)], now=NOW)
    assert rerun[1] is None and rerun[0] is not None and rerun[0].of("r") is not None


def test_a_job_that_ran_passes_the_jobs_its_owners_budget_holds_in_its_line_but_not_the_others() -> None:
    urgent = held("urgent").model_copy(update={"priority": 100})
    before = held("before", at=NOW - timedelta(hours=1)).model_copy(update={"ran": True})
    line = spent_record().queued(urgent)
    rerun = held("r", attempt=2, at=NOW + timedelta(minutes=1)).model_copy(update={"ran": True})
    usage = [used(1, NOW - timedelta(hours=1), NOW)]
    new, full = budget.admit(line, rerun, QUOTA, policy=policy("wait"), usage=usage, now=NOW)
    assert full is None and new is not None and new.of("r") == rerun, "w and urgent wait for December"
    new, full = budget.admit(line.queued(before), rerun, QUOTA, policy=policy("wait"), usage=usage, now=NOW)
    assert full == admission.Full("1 earlier job of owner 'team-a' waits first (before next); 0 of 4 nodes in use "
                                  "(max_active_instances_per_owner)"), "a job that ran and came first goes first"


def test_an_attempt_that_takes_its_jobs_place_charges_what_the_earlier_one_cost() -> None:
    record = AdmissionRecord(reservations=(held("r", at=NOW - timedelta(hours=1)),))
    usage = [used(1, NOW - timedelta(hours=1), NOW - timedelta(minutes=30)), used(2, NOW, None)]
    new, full = budget.admit(record, held("r", attempt=2), QUOTA, policy=policy(), usage=usage, now=NOW)
    assert full is None and new is not None
    assert (new.spent, new.month, new.owner) == (pytest.approx(3.0), "2026-11", "team-a")
    assert new.reservations == (held("r", attempt=2),)


def test_with_wait_a_freed_slot_takes_only_the_jobs_that_ran_from_the_lines_of_owners_at_their_budget() -> None:
    rerun = held("r").model_copy(update={"ran": True})
    lines = [spent_record().queued(rerun), AdmissionRecord(waiting=(held("v"),))]
    assert budget.open_lines(lines, policy("wait"), NOW) == [
        lines[0].model_copy(update={"waiting": (rerun,)}), lines[1]], "w waits for December, the rerun goes on"
    assert budget.open_lines(lines, policy("refuse"), NOW) == lines, "refuse: the admission refuses them"
    told = budget.to_tell([*lines, AdmissionRecord().charged("team-a", 85, NOW)], policy(), NOW)
    assert [(s.owner, level) for s, level in told] == [("team-a", "exceeded"), ("team-a", "warning")]


@pytest.mark.parametrize(("text", "field"), [
    ("budgets: {monthly_usd: {team-a: 0}}", "budgets.monthly_usd.team-a"),
    ("budgets: {monthly_usd: {team-a: 2e9}}", "budgets.monthly_usd.team-a"),
    ("budgets: {monthly_usd: {Team A: 5}}", "budgets.monthly_usd.Team A"),
    ("budgets: {warn_at_percent: 0}", "budgets.warn_at_percent"),
    ("budgets: {warn_at_percent: 101}", "budgets.warn_at_percent"),
    ("budgets: {on_exceeded: stop}", "budgets.on_exceeded"),
    ("budgets: {monthly_usd: {}, limit: 5}", "budgets.limit"),
])
def test_policy_fields_are_bounded_and_errors_name_them(text: str, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_policy(text)
    assert field in {e.path for e in refused.value.errors}, refused.value.errors


def test_an_owners_own_on_exceeded_wins_over_the_deployments() -> None:
    mixed = policy_from({"budgets": {"monthly_usd": {"team-a": 100}, "on_exceeded": "refuse",
                                     "on_exceeded_by_owner": {"team-a": "wait"}}})
    assert (mixed.budgets.on_exceeded_for("team-a"), mixed.budgets.on_exceeded_for("team-b")) == ("wait", "refuse")
    new, full = budget.admit(spent_record(), held("x"), QUOTA, policy=mixed, usage=[], now=NOW)
    assert full is not None and new is not None and [w.job_id for w in new.waiting] == ["w", "x"], "it waits"
    assert budget.open_lines([spent_record()], mixed, NOW)[0].waiting == (), "its line holds till the month turns"
    with pytest.raises(SpecError, match=r"budgets\.on_exceeded_by_owner"):
        parse_policy("budgets: {on_exceeded_by_owner: {team-a: later}}\n")


def test_the_check_prices_reservations_by_what_their_vms_run_as_and_the_reclaim_charges_what_they_ran() -> None:
    from jobplane.clouds.base import Instance

    vms = [Instance(id=f"i-{n}", state="running", launched_at=NOW, managed=True, job_id="a", attempt=1, rank=n,
                    instance_type="p4d.24xlarge") for n in range(2)]
    vms.append(Instance(id="i-x", state="running", launched_at=NOW, managed=True, job_id="b", attempt=1,
                        instance_type="x9.unpriced"))
    rates = budget.ran_rates(vms, "aws", Policy())
    assert rates == {("a", 1): pytest.approx(2 * 21.96)}, "two p4d VMs; b's type has no price: its estimate stays"
    n1 = Instance(id="n", state="running", launched_at=NOW, managed=True, job_id="g", attempt=1,
                  instance_type="n1-standard-8")
    e2 = Instance(id="e", state="running", launched_at=NOW, managed=True, job_id="e", attempt=1,
                  instance_type="e2-standard-2")
    assert budget.ran_rates([n1, e2], "gcp", Policy()) == {("e", 1): 0.067006}, \
        "an N1 VM's GPUs are not in the listing: its estimate, which counts them, stands"
    record = AdmissionRecord(reservations=(held("a", rate=99.0), held("b", rate=7.0)))
    priced = budget.repriced(record, rates)
    assert [(r.job_id, r.rate, r.priced) for r in priced.reservations] == [("a", pytest.approx(43.92), True),
                                                                           ("b", 7.0, False)]
    assert budget.repriced(priced, rates) == priced, "a second check writes nothing"
    assert budget.repriced(priced, {("a", 1): 21.96}) == priced, "one rank's VM gone: its hours so far stand"
    ran = [used(1, NOW - timedelta(hours=1), NOW - timedelta(minutes=30))]
    charged = budget.reclaim_charge(priced, {"a", "b"}, {"a": ran, "b": None}.get, NOW + timedelta(minutes=30))
    assert charged.spent == pytest.approx(0.5 * 6.0 + 0.5 * 7.0), "a: its usage; b: no record, its half hour at $7"


def test_client_budgets_items_are_named_as_annotated() -> None:
    """Issue 63: Client.budgets() items printed as `Standing(...)`, a queue type's name, while annotated Budget."""
    import typing

    from jobplane import sdk

    assert typing.get_type_hints(sdk.Client.budgets)["return"] == list[sdk.Budget]
    assert repr(budget.Budget("team-a", 5, 10)).startswith("Budget(owner='team-a'")
    assert sdk.Budget is budget.Budget and sdk.Standing is not sdk.Budget
