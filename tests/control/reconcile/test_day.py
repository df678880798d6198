"""The reconcilers through a day, in memory (see tests/control/reconcile/day.py): each scenario is a timeline of
what the user, the agents and the cloud did and what the functions' runs made of it."""

from __future__ import annotations

from jobplane.decide.model import Rule
from jobplane.model.states import State
from tests.control.reconcile.day import Day, rules
from tests.helpers import race


def test_a_job_that_goes_quiet_is_stalled_and_its_vm_terminated(day: Day) -> None:
    assert day.submit("quiet", stall_timeout="30m") == "launched"
    day.at("12:01")
    day.beat("quiet")
    assert rules(day.sweeper()) == [(Rule.STARTED, "applied")]
    for hhmm in ("12:11", "12:21", "12:31"):  # the agent beats; the user process prints nothing more
        day.at(hhmm)
        day.beat("quiet", output=False)
        assert day.sweeper() == [], f"30 minutes without output are not over at {hhmm}"
    day.at("12:32")
    assert rules(day.sweeper()) == [(Rule.STALLED, "applied")]
    assert day.vms("quiet") == {1: ["shutting-down"]}
    day.at("12:33")
    assert day.vms("quiet") == {1: ["terminated"]}
    assert day.history("quiet") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:32 STALLED"]
    quiet = day.job("quiet")
    assert (quiet.cause, quiet.reason) == (Rule.STALLED, "no new output for 31m (stall_timeout 30m)")
    assert day.metrics.totals["Stalls"] == 1


def test_a_preempted_spot_job_without_restarts_left_fails(day: Day) -> None:
    day.started("once", spot="true", max_restarts=0)  # 12:00 launched, 12:01 RUNNING
    day.at("12:40")
    day.preempted("once")
    assert rules(day.rerun(jobs=["once"]))[-1] == (Rule.RERUN_EXHAUSTED, "applied")
    final = day.job("once")
    assert (final.state, final.cause) == (State.FAILED, Rule.RERUN_EXHAUSTED)
    assert final.reason == "preempted; no restarts left (max_restarts 0)"
    assert day.history("once")[-1] == "12:40 FAILED" and day.vms("once") == {1: ["shutting-down"]}
    assert day.reg.preempted() == {} and day.compute.launches[-1].attempt == 1, "no second attempt"


def test_a_lost_rank_of_a_two_node_spot_job_tears_the_attempt_down_and_reruns_it(day: Day) -> None:
    day.started("pair", spot="true", num_nodes=2)  # 12:00 launched, 12:01 RUNNING
    day.at("12:30")
    day.compute.reclaim(day.job("pair").instances[1])  # no notice reached the agent: the VM is just gone
    day.at("12:33")
    assert rules(day.sweeper()) == [(Rule.LOST_SPOT, "applied")]
    assert day.vms("pair") == {1: ["shutting-down", "terminated"]}, "rank 0 survived; the check ended it"
    assert day.sweeper() == [], "a PREEMPTED job with its marker is the rerun's"
    assert rules(day.rerun(jobs=["pair"])) == [(Rule.RERUN, "applied")]
    day.at("12:35")
    day.beat("pair")
    day.sweeper()
    second = day.job("pair")
    assert second.state == State.RUNNING and second.attempt == 2 and second.restarts == 1
    assert day.vms("pair") == {1: ["terminated", "terminated"], 2: ["running", "running"]}
    assert day.history("pair") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:33 PREEMPTED", "12:33 LAUNCHING 2",
                                   "12:35 RUNNING 2"]
    lost = [e for e in day.reg.events("pair") if e.get("to") == State.PREEMPTED]
    assert "Spot capacity lost: rank 1" in lost[0]["reason"]


def test_five_overlapping_rerun_runs_launch_exactly_one_attempt(day: Day) -> None:
    day.started("spotty", spot="true")  # 12:00 launched, 12:01 RUNNING
    day.at("12:40")
    day.preempted("spotty")
    assert len(race(5, lambda _: day.rerun(), Exception)) == 5, "no run failed"
    after = day.job("spotty")
    assert after.state == State.LAUNCHING and after.attempt == 2 and after.restarts == 1
    assert [r.attempt for r in day.compute.launches] == [1, 2], "attempt 1 and exactly one rerun"
    assert day.reg.preempted() == {} and day.metrics.totals["Reruns"] == 1


def test_a_runaway_job_is_asked_to_stop_then_timed_out(day: Day) -> None:
    day.started("long", max_runtime="1h")  # 12:00 launched, 12:01 RUNNING
    day.at("12:53")
    assert day.uptime_cap() == []
    day.at("12:54")  # the cap less the stop grace (10 minutes, at most a tenth of the cap)
    assert rules(day.uptime_cap()) == [(Rule.STOP, "applied")]
    assert day.reg.get_json("jobs/long/control/stop")["by"] == "uptime-cap"
    day.at("13:01")
    assert rules(day.uptime_cap()) == [(Rule.TIMED_OUT, "applied")]
    final = day.job("long")
    assert final.state == State.TIMED_OUT and final.reason == "uptime cap 1h reached"
    assert day.history("long") == ["12:00 LAUNCHING", "12:01 RUNNING", "13:01 TIMED_OUT"]
    assert day.vms("long") == {1: ["shutting-down"]} and day.metrics.totals["Timeouts"] == 1


def test_a_leaked_vm_is_terminated_after_the_grace_and_an_untagged_one_never(day: Day) -> None:
    leaked = day.compute.add("ghost", 1)
    untagged = day.compute.add(managed=False)
    day.at("12:05")
    assert day.sweeper() == []
    day.at("12:11")  # orphan grace: 10 minutes
    assert rules(day.sweeper()) == [(Rule.ORPHAN, "applied")]
    assert day.compute.state(leaked) == "shutting-down" and day.metrics.totals["OrphansTerminated"] == 1
    day.at("23:59")
    assert day.sweeper(force=True) == [] and day.uptime_cap(force=True) == []
    assert day.compute.state(untagged) == "running" and day.compute.refused == []


def test_a_vm_that_never_boots_is_retried_as_a_restart(day: Day) -> None:
    day.submit("slow")
    first = day.job("slow").instances
    day.at("12:15")
    assert day.sweeper() == []
    day.at("12:16")  # boot timeout: 15 minutes
    assert rules(day.sweeper()) == [(Rule.BOOT_RETRY, "applied")]
    after = day.job("slow")
    assert after.attempt == 2 and after.restarts == 1 and after.state == State.LAUNCHING
    assert day.vms("slow") == {1: ["shutting-down"], 2: ["pending"]} and after.instances != first


def test_no_capacity_waits_then_launches_once_the_zone_has_room(day: Day) -> None:
    day.compute.fail("t3.micro")
    assert day.submit("patient") == "waiting"
    assert day.job("patient").state == State.WAITING_CAPACITY and day.compute.launches == []
    day.at("12:10")
    day.compute.restore("t3.micro")
    day.backstop()
    assert day.job("patient").state == State.LAUNCHING and [r.attempt for r in day.compute.launches] == [1]
    assert day.history("patient") == ["12:00 LAUNCHING", "12:00 WAITING_CAPACITY", "12:10 LAUNCHING"]
