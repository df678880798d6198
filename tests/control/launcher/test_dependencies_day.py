"""`after:` (Slurm's --dependency, AWS Batch's dependsOn) through a day on the manual clock
(tests/control/reconcile/day.py): a chain A -> B -> C runs in order, each launched by the sweep that saw the one
before succeed; B failing ends C FAILED naming B at once; a dependency on a job nobody submitted is refused naming
the field. A job `after:` an array starts the moment its last member SUCCEEDED (the pass that ends the array
COMPLETED launches it); each kind, afterok, afterany and afternotok, on a job and on an array, goes on or fails as
Slurm's do (on main `after:` named jobs alone, afterok only, and an array's id was refused as no job)."""

from __future__ import annotations

import pytest

from jobplane.decide.rules import LaunchCause
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.sweeps.record import SweepState
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import launch_drops, record, start


def runs_to_the_end(day: Day, job_id: str, code: int, hhmm: str) -> None:
    """At hhmm the job beats, then exits with `code`, and the exit report's event runs the sweep."""
    day.at(hhmm)
    day.beat(job_id)
    day.sweeper()
    day.exits(job_id, 0, code)
    day.sweeper(jobs=[job_id])


def test_a_chain_runs_in_order_each_launched_by_the_end_of_the_one_before(day: Day) -> None:
    assert day.submit("a") == "launched"
    assert day.submit("b", "after: [a]\n") == "waiting"
    assert day.submit("c", "after: [b]\n") == "waiting"
    assert (day.job("b").reason, day.job("b").cause) == ("waiting for a (LAUNCHING) (after)", LaunchCause.AFTER)
    assert day.job("c").reason == "waiting for b (WAITING_CAPACITY) (after)"
    runs_to_the_end(day, "a", 0, "12:10")
    assert day.job("a").state == State.SUCCEEDED and day.job("b").state == State.LAUNCHING
    assert day.history("b")[-1] == "12:10 LAUNCHING" and day.job("c").state == State.WAITING_CAPACITY
    runs_to_the_end(day, "b", 0, "12:20")
    assert day.history("c")[-1] == "12:20 LAUNCHING"
    runs_to_the_end(day, "c", 0, "12:30")
    assert [day.job(j).state for j in "abc"] == [State.SUCCEEDED] * 3
    assert [k for k, _, _ in day.reg.listing(keys.AFTER)] == [], "the marks go once used"


def test_b_failing_ends_c_failed_naming_b(day: Day) -> None:
    day.submit("a")
    day.submit("b", "after: [a]\n")
    day.submit("c", "after: [b]\n")
    runs_to_the_end(day, "a", 0, "12:10")
    runs_to_the_end(day, "b", 1, "12:20")
    b, c = day.job("b"), day.job("c")
    assert b.state == State.FAILED and (c.state, c.cause) == (State.FAILED, LaunchCause.DEPENDENCY_FAILED)
    assert c.reason == f"dependency b ended FAILED: {b.reason} (after)"
    assert day.history("c") == ["12:00 LAUNCHING", "12:00 WAITING_CAPACITY", "12:20 LAUNCHING", "12:20 FAILED"]
    assert day.compute.instances(job_id="c") == []


def test_a_dependency_nobody_submitted_is_refused_naming_the_field(day: Day) -> None:
    day.submit("a")
    assert day.submit("d", "after: [a, nobody, d]\n") == "invalid"
    errors = day.reg.get_json(keys.rejected_error("d"))["errors"]
    assert [(e["field"], e["message"]) for e in errors] == [
        ("after[1]", "no job or array 'nobody': submit what this one waits for first"),
        ("after[2]", "a job cannot wait for itself")]


def test_a_job_after_an_array_starts_the_moment_its_last_member_succeeded(day: Day) -> None:
    assert day.submit("arr", "array: {size: 3}\n") == "array"
    assert day.submit("next", "after: [arr]\n") == "waiting"  # an array's id is a dependency, not "no job"
    assert day.job("next").reason == "waiting for array arr (RUNNING) (after)"
    assert [k for k, _, _ in day.reg.listing(keys.AFTER)] == [keys.waiting_for("arr", "next")]
    assert launch_drops(day) == ["arr-0", "arr-1", "arr-2"]
    start(day, "arr-0", "arr-1", "arr-2")
    day.at("12:10")
    for member in ("arr-0", "arr-1"):
        day.exits(member, 0, 0)
    day.sweeper(jobs=["arr-0", "arr-1"])
    assert record(day, "arr").state == SweepState.RUNNING and day.job("next").state == State.WAITING_CAPACITY
    day.at("12:20")
    day.exits("arr-2", 0, 0)
    day.sweeper(jobs=["arr-2"])  # the exit report's pass: the check, the array's end, then its dependents
    assert record(day, "arr").state == SweepState.COMPLETED
    assert day.history("next")[-1] == "12:20 LAUNCHING" and day.job("next").instances
    assert [k for k, _, _ in day.reg.listing(keys.AFTER)] == [], "the marks go once used"


@pytest.mark.parametrize(("kind", "code", "launched"), [
    pytest.param("afterok", 0, True, id="afterok, COMPLETED: go"),
    pytest.param("afterok", 3, False, id="afterok, FAILED: fail"),
    pytest.param("afterany", 0, True, id="afterany, COMPLETED: go"),
    pytest.param("afterany", 3, True, id="afterany, FAILED: go"),
    pytest.param("afternotok", 0, False, id="afternotok, COMPLETED: fail"),
    pytest.param("afternotok", 3, True, id="afternotok, FAILED: go"),
])
def test_each_kind_after_an_array(day: Day, kind: str, code: int, launched: bool) -> None:
    day.submit("arr", "array: {size: 2}\n")
    assert day.submit("next", f"after: [{kind}:arr]\n") == "waiting"
    launch_drops(day)
    start(day, "arr-0", "arr-1")
    day.at("12:10")
    day.exits("arr-0", 0, 0)
    day.exits("arr-1", 0, code)  # the last member: SUCCEEDED (the array COMPLETED) or FAILED (the array FAILED)
    day.sweeper(jobs=["arr-0", "arr-1"])
    array, after = record(day, "arr"), day.job("next")
    assert array.state == (SweepState.COMPLETED if code == 0 else SweepState.FAILED)
    if launched:
        assert (after.state, day.history("next")[-1]) == (State.LAUNCHING, "12:10 LAUNCHING")
        return
    assert (after.state, after.cause) == (State.FAILED, LaunchCause.DEPENDENCY_FAILED)
    assert after.reason == (f"dependency array arr ended FAILED: {array.reason} (after)" if kind == "afterok" else
                            "dependency array arr ended COMPLETED: afternotok:arr can never be met (after)")
    assert day.compute.instances(job_id="next") == []


@pytest.mark.parametrize(("kind", "code", "launched"), [
    pytest.param("afterany", 1, True, id="afterany, FAILED: go"),
    pytest.param("afterany", 0, True, id="afterany, SUCCEEDED: go"),
    pytest.param("afternotok", 1, True, id="afternotok, FAILED: go"),
    pytest.param("afternotok", 0, False, id="afternotok, SUCCEEDED: fail"),
    pytest.param("afterok", 0, True, id="afterok written out, SUCCEEDED: go"),
])
def test_each_kind_after_a_job(day: Day, kind: str, code: int, launched: bool) -> None:
    day.submit("a")
    assert day.submit("b", f"after: [{kind}:a]\n") == "waiting"
    assert day.job("b").reason == ("waiting for a (LAUNCHING) (after)" if kind == "afterok" else
                                   f"waiting for {kind}:a (LAUNCHING) (after)")
    runs_to_the_end(day, "a", code, "12:10")
    b = day.job("b")
    if launched:
        assert day.history("b")[-1] == "12:10 LAUNCHING"
    else:
        assert (b.state, b.reason) == (State.FAILED, "dependency a ended SUCCEEDED: afternotok:a can never be met "
                                                     "(after)")


def test_a_dependency_whose_record_is_unreadable_keeps_the_job_waiting_visibly_until_its_max_wait(day: Day) -> None:
    """Issue 58: on main the gate's read of the dependency raised, after the claim: the job stayed LAUNCHING for good,
    past its max_wait. Now it waits, naming the dependency and why, its backoff gating it again (the platform team may
    fix the record), and fails at its max_wait like any wait."""
    assert day.submit("a") == "launched"
    assert day.submit("b", "after: [a]\nmax_wait: 1h\n") == "waiting"
    day.store.put(day.reg.key(keys.job_record("a")), b"{torn")
    day.at("12:05")
    day.backstop()
    b = day.job("b")
    assert (b.state, b.cause, b.reason) == (State.WAITING_CAPACITY, LaunchCause.AFTER,
                                            "waiting for a (its job.json does not parse) (after)")
    day.at("13:01")
    day.backstop()
    b = day.job("b")
    assert (b.state, b.cause) == (State.FAILED, LaunchCause.MAX_WAIT)
    assert b.reason == "waiting for a (its job.json does not parse) (after) within max_wait 1h: waiting for a (its " \
                       "job.json does not parse) (after)"
