"""Budgets per owner (issue 40), through a day on the manual clock: an owner's spend this calendar month (UTC), by
the same estimate `jobplane cost` makes (instance time x hourly price), warns the owner once at warn_at_percent,
and at its budget the owner's new jobs are refused or wait in its line (budgets.on_exceeded), with the figures in
the reason, until the month turns. On main the policy had no budgets: the field was refused, and every job ran."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from jobplane.clouds.base import Notice
from jobplane.deployment.notify import Notify
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.ops import budgets, queue
from tests.control.reconcile.day import Day

# $60 an hour: a node costs $1 a minute, so team-a's $10 is 80% spent at 12:08 and spent at 12:10
POLICY = ("prices: {{t3.micro: 60.0}}\ndefault_max_wait: 10d\n"
          "budgets:\n  monthly_usd: {{team-a: 10}}\n  on_exceeded: {}\n")
SPENT = "budget: $10.00 of $10.00 this month for team-a (budgets.monthly_usd)"


class Inbox:
    """The deployment's topic: what subscribers get."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def publish(self, notice: Notice) -> None:
        self.notices.append(notice)

    def events(self) -> list[Any]:
        return [n.data["event"] for n in self.notices]


def check(day: Day, hhmm: str) -> None:
    """At hhmm every job with VMs beats and the scheduled check runs."""
    day.at(hhmm)
    for live in {inst.job_id for inst in day.compute.list_managed()}:
        day.beat(str(live))
    day.sweeper()


def next_month(day: Day) -> None:
    day.clock.advance((datetime(2026, 12, 1, 0, 0, 30, tzinfo=day.clock().tzinfo) - day.clock()).total_seconds())


@pytest.fixture
def inbox(day: Day) -> Inbox:
    box = Inbox()
    day.notify = Notify(box, day.metrics)
    return box


def spend_it(day: Day, inbox: Inbox, on_exceeded: str) -> None:
    """team-a's a1 runs 12:00-12:10 and spends the $10; team-b, with no budget, runs b1."""
    day.reg.put(keys.POLICY, POLICY.format(on_exceeded).encode())
    assert [day.drop("team-a", "a1"), day.drop("team-b", "b1")] == ["launched"] * 2
    for hhmm in ("12:01", "12:05", "12:07"):
        check(day, hhmm)
    assert inbox.notices == [], "under 80% nobody is told"
    check(day, "12:08")
    assert inbox.events() == ["budget-warning"]
    assert inbox.notices[0].subject == "jobplane: budget of team-a at 80%"
    assert inbox.notices[0].text.startswith("team-a has spent 80% of its budget: $8.00 of $10.00 this month (80%)")
    check(day, "12:09")
    assert inbox.events() == ["budget-warning"], "told once a month, not at every check"
    day.at("12:10")
    day.exits("a1", 0, 0)
    day.sweeper(jobs=["a1"])
    assert day.job("a1").state == State.SUCCEEDED
    assert inbox.events() == ["budget-warning", "budget-exceeded"]
    assert [(b.owner, b.figures) for b in budgets.standings(day.reg, day.clock())] == [
        ("team-a", "$10.00 of $10.00 this month (100%)")]


def test_refuse_ends_the_owners_next_job_failed_with_the_figures_until_the_month_turns(day: Day, inbox: Inbox) -> None:
    spend_it(day, inbox, "refuse")
    day.at("12:11")
    assert day.drop("team-a", "a2") == "failed"
    refused = day.job("a2")
    assert (refused.state, refused.reason, refused.cause) == (State.FAILED, f"refused: {SPENT}", "over-budget")
    assert not day.compute.instances(job_id="a2"), "no VM was asked for"
    assert day.drop("team-b", "b2") == "launched", "another owner's jobs go on"
    check(day, "12:12")
    assert inbox.events() == ["budget-warning", "budget-exceeded"]

    next_month(day)
    assert day.drop("team-a", "a3") == "launched", "a new month, a new budget"
    assert budgets.standings(day.reg, day.clock())[0].figures == "$1.00 of $10.00 this month (10%)", \
        "30 s of a3 (billed a minute at least), nothing of November's"


def test_wait_holds_the_owners_next_job_in_its_line_until_the_month_turns(day: Day, inbox: Inbox) -> None:
    spend_it(day, inbox, "wait")
    day.at("12:11")
    assert day.drop("team-a", "a2") == "waiting"
    waiting = day.job("a2")
    assert (waiting.state, waiting.reason, waiting.cause) == (State.WAITING_CAPACITY, SPENT, "over-budget")
    assert [(s.job_id, s.position, s.why) for s in queue.standing(day.reg, now=day.clock())] == [("a2", 1, SPENT)]

    day.at("12:20")  # team-b's job ends: a freed slot admits no job of an owner past its budget
    day.exits("b1", 0, 0)
    day.sweeper(jobs=["b1"])
    day.at("12:30")
    day.backstop()
    assert day.job("a2").state == State.WAITING_CAPACITY and not day.compute.instances(job_id="a2")

    next_month(day)
    day.backstop()  # the first backstop of the month admits it
    assert day.job("a2").state == State.LAUNCHING and len(day.compute.instances(job_id="a2")) == 1
    check(day, "00:05")
    assert inbox.events() == ["budget-warning", "budget-exceeded"], "a new month starts untold, and under 80%"


def test_a_rerun_is_held_neither_by_the_budget_nor_by_a_job_waiting_for_it(day: Day) -> None:
    """Issue 58: a preempted job's rerun is exempt from its owner's budget (the job ran: no new spending decision),
    and so it does not wait behind the owner's new jobs that do, even one of a higher priority. On main it waited
    behind such a job in the owner's line until the month turned."""
    day.reg.put(keys.POLICY, (POLICY.format("wait") + "spot_prices: {t3.micro: 60.0}\n"
                              "priority_classes: {urgent: {value: 100}}\n").encode())
    assert day.drop("team-a", "a1", spec="spot: true\n") == "launched"
    check(day, "12:01")
    assert day.job("a1").state == State.RUNNING
    check(day, "12:10")
    day.at("12:11")
    assert day.drop("team-a", "x", spec="priority: urgent\n") == "waiting"
    assert day.job("x").reason == "budget: $11.00 of $10.00 this month for team-a (budgets.monthly_usd)"
    day.at("12:20")
    day.preempted("a1")
    day.rerun(jobs=["a1"])
    a1 = day.job("a1")
    assert (a1.state, a1.attempt) == (State.LAUNCHING, 2) and len(day.compute.instances(job_id="a1")) == 2
    assert [(s.job_id, s.why) for s in queue.standing(day.reg, now=day.clock())] == [
        ("x", "budget: $21.00 of $10.00 this month for team-a (budgets.monthly_usd)")], "the rerun's minute counts"
