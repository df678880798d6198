"""An owner's quota is a queue (issue 40), through a day on the manual clock (tests/control/reconcile/day.py): the
oldest waiting job goes first, a later drop never passes it even when it would fit, a cancelled waiter leaves the
line, and the run that frees a slot (the sweep an exit report's event starts) launches the next job at once: 0 s on
this clock from the end that freed the slot to the next job's launch, where on main the next one waited for its
backoff's retry by the backstop (a minute, doubling per try up to 30)."""

from __future__ import annotations

from datetime import datetime

import pytest

from jobplane.clouds.base import Instance, LaunchRequest
from jobplane.model import keys
from jobplane.model.admission import AdmissionRecord
from jobplane.model.states import State
from jobplane.ops import cancels, queue
from tests.control.reconcile.day import Day


def launched_at(day: Day, job_id: str) -> list[str]:
    """When the job's attempts were launched (the events of the writes that recorded their VMs), HH:MM."""
    return [f"{datetime.fromisoformat(e['time']):%H:%M}" for e in day.reg.events(job_id) if e.get("instances")
            and e.get("to") == State.LAUNCHING]


def ended_at(day: Day, job_id: str) -> str:
    return f"{day.job(job_id).state_since:%H:%M}"


def test_the_oldest_waiting_job_goes_first_the_moment_a_slot_frees(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 2\n")
    for hhmm, job_id in (("12:00", "a"), ("12:00", "b"), ("12:01", "c"), ("12:02", "d"), ("12:03", "e")):
        day.at(hhmm)
        day.submit(job_id)
    assert [day.job(j).state for j in "abcde"] == [State.LAUNCHING] * 2 + [State.WAITING_CAPACITY] * 3
    assert day.job("c").reason == ("owner 'default' has 2 active instances; 1 more would exceed the quota of 2 "
                                   "(max_active_instances_per_owner)")
    assert day.job("e").reason == ("2 earlier jobs of owner 'default' wait first (c next); 2 of 2 nodes in use "
                                   "(max_active_instances_per_owner)")
    day.at("12:04")
    for job_id in "ab":
        day.beat(job_id)
    day.sweeper()

    day.at("12:10")  # b ends: the sweep its exit report's event starts launches c, the oldest waiting
    day.exits("b", 0, 0)
    day.sweeper(jobs=["b"])
    assert day.job("b").state == State.SUCCEEDED and launched_at(day, "c") == [ended_at(day, "b")] == ["12:10"]
    assert day.job("d").state == State.WAITING_CAPACITY

    day.at("12:12")  # a 1-node drop now: the quota is full and d and e were first
    day.submit("f")
    assert day.job("f").reason == ("2 earlier jobs of owner 'default' wait first (d next); 2 of 2 nodes in use "
                                   "(max_active_instances_per_owner)")
    cancels.cancel(day.reg, "d")  # a waiting job cancelled leaves the line

    day.at("12:20")
    day.exits("a", 0, 0)
    day.sweeper(jobs=["a"])
    assert launched_at(day, "e") == ["12:20"] and day.job("f").state == State.WAITING_CAPACITY

    day.at("12:21")  # the backstop's retry of f finds e's place taken and nobody before f: f waits for a slot
    day.backstop()
    assert day.job("f").state == State.WAITING_CAPACITY
    day.beat("c")
    day.sweeper()
    day.at("12:30")
    day.exits("c", 0, 0)
    day.sweeper(jobs=["c"])
    assert launched_at(day, "f") == ["12:30"]
    order = sorted("abcef", key=lambda j: (launched_at(day, j), j))
    assert order == ["a", "b", "c", "e", "f"] and launched_at(day, "d") == []
    assert AdmissionRecord.parse(day.reg.get_bytes(keys.admission_owner("default"))).waiting == ()


def test_a_big_job_at_the_head_of_the_line_is_not_passed_by_small_ones(day: Day) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 4\n")
    day.submit("small-1", num_nodes=3)
    day.at("12:01")
    day.submit("big", num_nodes=4)
    day.at("12:02")
    assert day.submit("small-2") == "waiting", "one node is free, but big was first"
    day.at("12:03")
    day.beat("small-1")
    day.sweeper()
    day.at("12:10")
    day.exits("small-1", 0, 0)
    day.exits("small-1", 1, 0)
    day.exits("small-1", 2, 0)
    day.sweeper(jobs=["small-1"])
    assert launched_at(day, "big") == ["12:10"] and day.job("small-2").state == State.WAITING_CAPACITY


def test_a_running_job_s_cancel_admits_the_next_at_the_check_its_stopping_agent_s_exit_report_starts(day: Day) -> None:
    """The cancel (the CLI's) gives the slot back and launches nothing itself; its agent, told to stop, writes its
    exit report, whose event starts the check that admits the next job (0 s here), on either cloud (a job's exit
    report is routed to the check whatever its state)."""
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 1\n")
    day.submit("a")
    day.at("12:01")
    assert day.submit("b") == "waiting"
    day.at("12:02")
    day.beat("a")
    day.sweeper()
    day.at("12:05")
    cancels.cancel(day.reg, "a")
    assert day.job("b").state == State.WAITING_CAPACITY
    day.at("12:06")
    day.exits("a", 0, 143, reason="stopped")
    day.sweeper(jobs=["a"])
    assert day.job("a").state == State.CANCELLED and launched_at(day, "b") == ["12:06"]


def test_a_job_cancelled_while_the_run_that_admitted_it_launches_it_passes_its_slot_on_in_that_run(
        day: Day, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user cancels the job a freed slot admitted while its RunInstances runs: the launch terminates its VMs and
    gives the slot back, and the same run admits the next job (on main it waited for the next check or backstop:
    up to 5 minutes)."""
    day.reg.put(keys.POLICY, PRIORITIES)
    day.submit("a")
    day.at("12:01")
    assert day.submit("b") == "waiting"
    assert day.submit("x", "priority: urgent\n") == "waiting"
    day.at("12:02")
    day.beat("a")
    day.sweeper()
    launch = day.compute.launch

    def cancelled_meanwhile(request: LaunchRequest) -> list[Instance]:
        if request.job_id == "x":
            cancels.cancel(day.reg, "x")
        return launch(request)

    monkeypatch.setattr(day.compute, "launch", cancelled_meanwhile)
    day.at("12:10")
    day.exits("a", 0, 0)
    day.sweeper(jobs=["a"])
    assert day.job("x").state == State.CANCELLED
    assert [i.job_id for i in day.compute.list_managed()] == ["b"]  # x's VM terminated at once
    assert launched_at(day, "b") == ["12:10"]


PRIORITIES = b"""max_active_instances_per_owner: 1
priority_classes:
  urgent: {value: 100, owners: [default]}
  batch: {value: -10}
  reserved: {value: 1000, owners: [team-ops]}
"""


def test_a_higher_priority_class_goes_first_within_the_owners_quota_and_fifo_within_a_class(day: Day) -> None:
    day.reg.put(keys.POLICY, PRIORITIES)
    day.submit("running")
    for hhmm, job_id, priority in (("12:01", "plain", ""), ("12:02", "overnight", "batch"),
                                   ("12:03", "urgent-1", "urgent"), ("12:04", "urgent-2", "urgent")):
        day.at(hhmm)
        assert day.submit(job_id, f"priority: {priority}\n" if priority else "") == "waiting"
    assert day.job("urgent-2").reason == ("1 earlier job of owner 'default' waits first (urgent-1 next, priority "
                                          "100); 1 of 1 nodes in use (max_active_instances_per_owner)")
    job = "running"
    for hhmm in ("12:10", "12:20", "12:30", "12:40"):
        day.at(hhmm)
        day.beat(job)
        day.sweeper()
        day.exits(job, 0, 0)
        day.sweeper(jobs=[job])
        [job] = [j for j in ("plain", "overnight", "urgent-1", "urgent-2") if launched_at(day, j) == [hhmm]]
        assert day.job(job).state == State.LAUNCHING
    assert sorted(("plain", "overnight", "urgent-1", "urgent-2"), key=lambda j: launched_at(day, j)) == [
        "urgent-1", "urgent-2", "plain", "overnight"]


def test_a_priority_class_the_policy_lacks_or_keeps_from_the_owner_is_refused_naming_priority(day: Day) -> None:
    day.reg.put(keys.POLICY, PRIORITIES)
    assert day.submit("unknown", "priority: asap\n") == "invalid"
    assert day.job("unknown").reason == "priority: 'asap' is not a priority class of this platform (batch, reserved, " \
                                        "urgent)"
    assert day.submit("not-ours", "priority: reserved\n") == "invalid"
    assert day.job("not-ours").reason == ("priority: owner 'default' may not use priority class 'reserved' (its "
                                          "owners: team-ops)")


def test_where_each_waiting_job_stands(day: Day) -> None:
    day.reg.put(keys.POLICY, PRIORITIES.replace(b"per_owner: 1", b"per_owner: 2"))
    day.submit("a")
    day.submit("b")
    day.at("12:01")
    day.submit("c")
    day.at("12:02")
    day.submit("d", "priority: urgent\n")
    day.submit("e", "after: [a]\n")
    assert [(s.position, s.job_id, s.priority, s.why) for s in queue.standing(day.reg)] == [
        (1, "d", 100, "owner 'default' has 2 active instances; 1 more would exceed the quota of 2 "
                      "(max_active_instances_per_owner)"),
        (2, "c", 0, "1 earlier job of owner 'default' waits first (d next, priority 100); 2 of 2 nodes in use "
                    "(max_active_instances_per_owner)"),
        (None, "e", 0, "dependency: waiting for a (LAUNCHING)")]
    assert day.job("d").reason == queue.standing(day.reg)[0].why, "the record's reason is the queue's why (issue 58)"
    assert [s.job_id for s in queue.standing(day.reg, owner="team-b")] == []
