"""`debug_hold` through a day (tests/control/reconcile/day.py): a FAILED attempt's VMs stay up for a look, untouched
by the orphan rule and the uptime cap, billed all along, and the sweeper terminates them when the hold is over."""

from __future__ import annotations

from datetime import timedelta

from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.records import HOLD_BY, StopRequest
from jobplane.model.states import State
from jobplane.views import cost, jobview
from tests.control.reconcile.day import MORNING, Day, rules


def held_keys(of: Day) -> list[str]:
    return [key for key, _, _ in of.reg.listing(keys.ACTIVE) if keys.parse_held(key)]


def test_a_failed_job_with_a_30m_debug_hold_keeps_its_vm_30_minutes_then_it_is_terminated(day: Day) -> None:
    day.started("held", debug_hold="30m", max_runtime="2h")  # 12:00 launched, 12:01 RUNNING
    day.at("12:10")
    day.exits("held", 0, code=3, error="ValueError: bad shape")
    assert rules(day.sweeper(jobs=["held"])) == [(Rule.FINISHED, "applied")]  # the exit report's event
    failed = day.job("held")
    assert (failed.state, failed.cause, failed.exit_code) == (State.FAILED, Rule.FINISHED, 3)
    assert failed.held_until == MORNING + timedelta(minutes=40)
    assert failed.reason == ("rank 0 exited with code 3: ValueError: bad shape; VMs held for debugging until "
                             "2026-11-22 12:40:00 UTC (debug_hold 30m)")
    assert jobview.held(failed, day.clock()) == ("held until 2026-11-22 12:40:00 UTC (30m00s left): "
                                                 "`jobplane ssh held` to look")
    assert held_keys(day) == ["active/held.1.held-until-" + str(int((MORNING + timedelta(minutes=40)).timestamp()))]

    # Every run in the next 30 minutes, well past the 10-minute orphan grace, leaves the VM up; it is billed.
    for hhmm in ("12:21", "12:30", "12:39"):
        day.at(hhmm)
        done = day.sweeper() + day.uptime_cap() + day.rerun()
        assert {o.action.rule for o in done} <= {Rule.CLEANUP}, hhmm  # the attempt's heartbeats and limits go
        assert day.vms("held") == {1: ["running"]} and len(held_keys(day)) == 1, hhmm
    spent = cost.job_cost(day.job("held"), day.clock())
    assert spent.running and round(spent.instance_hours * 60) == 39  # launched 12:00, still counting at 12:39

    day.at("12:40")
    (over,) = day.sweeper()
    assert (over.action.rule, over.result) == (Rule.HOLD_OVER, "applied")
    assert over.action.reason == ("debug hold of attempt 1 over at 2026-11-22 12:40:00 UTC: terminating "
                                  f"{failed.instances[0]}")
    assert day.vms("held") == {1: ["shutting-down"]}
    assert day.metrics.totals["HeldTerminated"] == 1 and held_keys(day) == []
    ended = day.job("held")
    assert ended.state == State.FAILED and not any(u.open for u in ended.usage)
    assert cost.job_cost(ended, day.clock() + timedelta(hours=5)).instance_hours == 40 / 60  # the hold is costed
    assert jobview.held(ended, day.clock()).endswith("(over: its VMs are terminated by the next check, if not already)")
    terminated = [e for e in day.reg.events("held") if e["kind"] == "terminated"]
    assert [(e["rule"], e["instances"]) for e in terminated] == [(Rule.HOLD_OVER, failed.instances)]
    day.at("12:45")
    assert day.sweeper() == [] and day.vms("held") == {1: ["terminated"]}


def test_a_failed_rank_holds_every_vm_of_its_attempt_and_asks_the_others_to_stop(day: Day) -> None:
    day.started("pair", num_nodes=2, debug_hold="15m")
    day.at("12:05")
    day.exits("pair", 1, code=1)
    assert rules(day.sweeper(jobs=["pair"])) == [(Rule.RANK_FAILED, "applied")]
    assert day.job("pair").state == State.FAILED and day.vms("pair") == {1: ["running", "running"]}
    stop = StopRequest.model_validate(day.reg.get_json(keys.stop_request("pair")))
    assert stop.by == HOLD_BY  # rank 0 checkpoints and stops; its agent keeps its VM up too
    day.exits("pair", 0, code=143, reason="stopped", stopped_by=HOLD_BY)
    day.at("12:19")
    assert rules(day.sweeper()) == [(Rule.CLEANUP, "applied")] and day.vms("pair") == {1: ["running", "running"]}
    day.at("12:20")
    assert rules(day.sweeper()) == [(Rule.HOLD_OVER, "applied")]
    assert day.vms("pair") == {1: ["shutting-down", "shutting-down"]}


def test_no_hold_for_a_job_that_succeeds_or_is_retried(day: Day) -> None:
    day.started("fine", debug_hold="30m")
    day.started("flaky", "retry: {on_exit_codes: [42], max: 1}\n", debug_hold="30m")
    day.at("12:05")
    day.exits("fine", 0, code=0)
    day.exits("flaky", 0, code=42)
    assert sorted(rules(day.sweeper(jobs=["fine", "flaky"]))) == [(Rule.FINISHED, "applied"), (Rule.RETRY, "applied")]
    assert day.job("fine").state == State.SUCCEEDED and day.job("fine").held_until is None
    flaky = day.job("flaky")
    assert (flaky.state, flaky.attempt, flaky.held_until) == (State.LAUNCHING, 2, None)
    assert held_keys(day) == [] and day.vms("flaky")[1] == ["shutting-down"]


def test_the_end_of_a_hold_terminates_only_what_jobplane_owns_and_within_the_blast_radius(day: Day) -> None:
    day.started("held", debug_hold="10m")
    day.at("12:05")
    day.exits("held", 0, code=1)
    day.sweeper(jobs=["held"])
    day.reg.put(keys.POLICY, b"safety: {max_terminations_per_run: 0}\n", "text/yaml")
    day.at("12:15")
    assert (Rule.HOLD_OVER, "refused") in rules(day.sweeper())
    assert day.vms("held") == {1: ["running"]} and len(held_keys(day)) == 1, "tried again by the next sweep"
    day.reg.delete(keys.POLICY)
    day.at("12:16")
    assert rules(day.sweeper()) == [(Rule.HOLD_OVER, "applied")] and day.vms("held") == {1: ["shutting-down"]}
    own = day.started("again", debug_hold="1m").instances[0]
    day.exits("again", 0, code=1)
    day.sweeper(jobs=["again"])
    spared = [day.compute.add("again", 1, managed=False),  # the job's tags, but not jobplane:managed
              day.compute.add("again", 1, protected=True)]
    day.at("12:30")
    assert (Rule.HOLD_OVER, "applied") in rules(day.sweeper())
    assert day.compute.state(own) == "shutting-down" and day.compute.refused == []
    assert [day.compute.state(i) for i in spared] == ["running"] * 2
