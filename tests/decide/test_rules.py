"""A rule in one place (issue 39): each rule of the check over a live job is one JobRule in decide.check.CHECKS,
owning its candidate filter, its decision and (by its place) its precedence; its name and facts are one member of
decide.rules.Rule, from which the risk order, the metrics and the dashboard's panels are derived. Pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jobplane.decide import check, rules
from jobplane.decide.effects import RequestStop, Transition
from jobplane.decide.jobrule import JobRule, Listed, Seen
from jobplane.decide.model import Action, Rule, Snapshot, claim
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.listings import ActiveMarker
from jobplane.model.policy import Policy
from jobplane.model.states import State
from tests.decide.helpers import NOW, POLICY, healthy, limits, record, report, snapshot


def _stop_everything(job: Seen) -> Action:
    return claim(job.record, Rule.STOP, "a rule under test", RequestStop())


def _look_at_everything(job: Listed) -> bool:
    return True


def test_a_rule_added_to_the_list_is_read_decided_and_ranked(monkeypatch: pytest.MonkeyPatch) -> None:
    """What adding a rule takes: its object in the list. Its filter alone makes a healthy job a candidate, its place
    alone puts it before the rules after it, and its name alone ranks its action among the check's."""
    healthy_job = Snapshot(**healthy())
    assert check.candidates(healthy_job, NOW, POLICY) == set()
    monkeypatch.setattr(check, "CHECKS", (*check.CHECKS, JobRule(Rule.STOP, _stop_everything, _look_at_everything)))
    assert check.candidates(healthy_job, NOW, POLICY) == {"j"}

    finished = snapshot(healthy(), records=[record()], exits={"j": [report(0, 0)]})
    assert [a.rule for a in check.decide(finished, NOW, POLICY)] == [Rule.FINISHED]  # FINISHED comes first
    before = (JobRule(Rule.STOP, _stop_everything), *check.CHECKS[:-1])
    monkeypatch.setattr(check, "CHECKS", before)
    (stop,) = check.decide(finished, NOW, POLICY)
    assert (stop.rule, stop.get(RequestStop)) == (Rule.STOP, RequestStop())


def test_each_rule_of_the_list_is_named_once() -> None:
    names = [rule.rule for rule in check.CHECKS]
    assert len(names) == len(set(names)), names
    assert {name for rule in check.CHECKS for name in rule.names} <= set(Rule)


def test_the_risk_order_is_the_members_order() -> None:
    assert sorted(Rule, key=rules.ORDER.__getitem__) == list(Rule)
    assert rules.ORDER[Rule.IGNORED] == 0 and rules.ORDER[Rule.ORPHAN] > rules.ORDER[Rule.FINISHED]


def test_every_metric_is_on_the_dashboard_panel_its_rule_names() -> None:
    panels = rules.panels()
    for rule in Rule:
        if rule.facts.metric:
            assert rule.facts.metric in panels[rule.facts.panel or ""], rule
    assert panels[rules.ENDS] == ["Timeouts", "CostStops", "Stalls", "HeldTerminated", "OrphansTerminated"]


def test_a_metric_without_its_panel_is_refused() -> None:
    with pytest.raises(ValueError, match="metric and its dashboard panel come together"):
        replace(Rule.STALLED.facts, panel=None)


def _budget_cents(record: JobRecord, policy: Policy) -> dict[str, int]:
    return {"budget": 500}


def _over_budget(job: Listed) -> bool:
    return job.limits is not None and job.limits.fact("budget") == 500


def test_the_numbers_a_rules_filter_reads_ride_on_the_running_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule needing a per-job number in the listing names it (JobRule.limits): the check writes it into the
    attempt's RUNNING marker's name when the job starts, and the rule's filter reads it back, with no change to
    model/keys.py."""
    rule = JobRule(Rule.STOP, _stop_everything, _over_budget, limits=_budget_cents)
    monkeypatch.setattr(check, "CHECKS", (*check.CHECKS, rule))
    launching = snapshot(healthy(), records=[record(state=State.LAUNCHING)])
    (started,) = [a for a in check.decide(launching, NOW, POLICY) if a.rule == Rule.STARTED]
    transition = started.get(Transition)
    assert transition is not None and transition.updates == {"limits": "nodes-1.stall-1800.cap-86400.budget-500"}
    marker = keys.parse_active_marker(keys.active_marker("j", State.RUNNING, 1, transition.updates["limits"]))
    assert marker is not None and marker.limits == replace(limits(), facts=(("budget", 500),))
    listed = Snapshot(**{**healthy(), "active": {"j": (ActiveMarker("j", State.RUNNING, 1, NOW, marker.limits),)}})
    assert check.candidates(listed, NOW, POLICY) == {"j"}
    assert keys.parse_active_marker("active/j/RUNNING.1.nodes-1.stall-1800.cap-86400") == \
        keys.MarkerKey("j", State.RUNNING, 1, limits())  # a marker written before facts
    assert keys.parse_limits("limits/j/1/nodes-1.stall-1800.cap-86400") == limits()  # an old limits/ key


def test_a_limits_fact_that_would_break_the_key_is_refused() -> None:
    with pytest.raises(ValueError, match="limits facts"):
        keys.limits_mark("j", 1, 1, 60, 3600, (("cap", 5),))
    with pytest.raises(ValueError, match="limits facts"):
        keys.limits_mark("j", 1, 1, 60, 3600, (("Budget/x", 5),))
