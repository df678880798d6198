"""`spot: {fallback: on_demand, after: D}` through a day, in memory (see tests/control/reconcile/day.py): Spot refused
in every zone and type for D, counted from the attempt's first refusal, and the attempt launches on-demand; the
next attempt asks for Spot again; describe's usage lines and `cost --by market` say which market ran."""

from __future__ import annotations

from datetime import timedelta

from jobplane.decide.model import Rule
from jobplane.decide.rules import LaunchCause
from jobplane.model.states import State
from jobplane.views import cost
from tests.control.reconcile.day import MORNING, Day, rules

FALLBACK = "spot: {fallback: on_demand, after: 20m}\n"


def markets(d: Day) -> list[bool]:
    return [r.spot for r in d.compute.launches]


def test_spot_refused_everywhere_launches_on_demand_at_exactly_after(day: Day) -> None:
    day.compute.fail(spot=True)  # no Spot in any zone or type; on-demand capacity is there
    assert day.submit("thrifty", FALLBACK) == "waiting"
    waiting = day.job("thrifty")
    assert waiting.spot_refused_at == MORNING and "t3.micro Spot in any zone" in (waiting.last_error or "")
    untils = []
    for minute in range(1, 20):  # the backstop's cron, every minute until 12:19
        day.at(f"12:{minute:02d}")
        day.backstop()
        record = day.job("thrifty")
        assert record.state == State.WAITING_CAPACITY and day.compute.launches == [], f"on-demand at 12:{minute}"
        assert record.spot_refused_at == MORNING, "the clock runs from the attempt's first refusal"
        untils.append(record.wait_until)
    # the backoff (1, 2, 4, 8 minutes...) ends at 12:20 exactly, not at 12:31
    assert sorted({f"{u:%H:%M}" for u in untils if u}) == ["12:03", "12:07", "12:15", "12:20"]
    day.at("12:20")
    day.backstop()
    launched = day.job("thrifty")
    assert launched.state == State.LAUNCHING and markets(day) == [False]
    assert launched.spot_refused_at is None and launched.wait_until is None
    fallback = "on-demand: Spot refused in every zone and type for 20m"
    assert (launched.cause, launched.reason) == (LaunchCause.LAUNCHED, f"launched 1 x t3.micro in {launched.zone} "
                                                                       f"({fallback})")
    event = next(e for e in day.reg.events("thrifty") if e.get("market"))
    assert (event["market"], event["fallback"], event["cause"]) == ("on-demand", fallback, LaunchCause.LAUNCHED)
    [used] = launched.usage
    assert used.market == "on-demand" and used.price_source == "price table"
    assert " on-demand in " in cost.describe_attempt(used, day.clock())  # describe's usage line

    # 13:00: the on-demand VM is gone (a host event); a Spot job's lost VM is rerun, and the rerun asks Spot first
    day.beat("thrifty")
    day.sweeper()
    day.compute.restore(spot=True)
    day.at("13:00")
    day.compute.reclaim(launched.instances[0])
    day.at("13:03")
    assert rules(day.sweeper()) == [(Rule.LOST_SPOT, "applied")]
    assert rules(day.rerun(jobs=["thrifty"])) == [(Rule.RERUN, "applied")]
    second = day.job("thrifty")
    assert second.state == State.LAUNCHING and second.attempt == 2 and markets(day) == [False, True]
    assert [u.market for u in second.usage] == ["on-demand", "spot"]


def test_a_rerun_after_a_preemption_asks_for_spot_and_waits_its_own_after(day: Day) -> None:
    day.started("resumer", FALLBACK)  # 12:00 launched on Spot, 12:01 RUNNING
    assert markets(day) == [True] and day.job("resumer").spot_refused_at is None
    day.at("12:30")
    day.compute.fail(spot=True)
    day.preempted("resumer")
    assert rules(day.rerun(jobs=["resumer"])) == [(Rule.RERUN, "applied")]
    second = day.job("resumer")
    # attempt 2 asked for Spot again; its own clock starts now (from the job's creation it would be over already)
    assert second.state == State.WAITING_CAPACITY and second.attempt == 2
    assert second.spot_refused_at == MORNING + timedelta(minutes=30) and markets(day) == [True]
    for hhmm in ("12:31", "12:33", "12:37", "12:45", "12:49"):
        day.at(hhmm)
        day.backstop()
        assert day.job("resumer").state == State.WAITING_CAPACITY, hhmm
    day.at("12:50")
    day.backstop()
    assert day.job("resumer").state == State.LAUNCHING and markets(day) == [True, False]
    day.at("12:51")
    day.beat("resumer")
    day.sweeper()
    assert day.history("resumer") == [
        "12:00 LAUNCHING", "12:01 RUNNING", "12:30 PREEMPTED", "12:30 LAUNCHING 2", "12:30 WAITING_CAPACITY 2",
        "12:31 LAUNCHING 2", "12:31 WAITING_CAPACITY 2", "12:33 LAUNCHING 2", "12:33 WAITING_CAPACITY 2",
        "12:37 LAUNCHING 2", "12:37 WAITING_CAPACITY 2", "12:45 LAUNCHING 2", "12:45 WAITING_CAPACITY 2",
        "12:50 LAUNCHING 2", "12:51 RUNNING 2"]
    # cost by market: attempt 1 (12:00 to 12:30) is Spot money, attempt 2 (from 12:50) on-demand
    day.at("13:50")
    rows = {row.group: row for row in cost.summarize([day.job("resumer")], day.clock(), by="market")}
    assert set(rows) == {"spot", "on-demand"} and rows["on-demand"].cost.instance_hours == 1.0
    assert round(rows["spot"].cost.instance_hours, 3) == 0.5


def test_spot_true_still_waits_for_spot(day: Day) -> None:
    day.compute.fail(spot=True)
    assert day.submit("patient", spot="true") == "waiting"
    for hhmm in ("12:01", "12:03", "12:07", "12:15", "12:31", "13:01", "13:31"):
        day.at(hhmm)
        day.backstop()
    record = day.job("patient")
    assert record.state == State.WAITING_CAPACITY and day.compute.launches == []
    assert record.wait_until is not None and record.wait_until - day.clock() == timedelta(minutes=30)
    day.compute.restore(spot=True)
    day.at("14:01")
    day.backstop()
    assert day.job("patient").state == State.LAUNCHING and markets(day) == [True]
