"""`after:` (Slurm's afterok, AWS Batch's dependsOn) through a day on the manual clock (tests/control/reconcile/day.py):
a chain A -> B -> C runs in order, each launched by the sweep that saw the one before succeed; B failing ends C
FAILED naming B at once; a dependency on a job nobody submitted is refused naming the field. All fail on main,
which has no `after:`."""

from __future__ import annotations

from jobplane.decide.rules import LaunchCause
from jobplane.model import keys
from jobplane.model.states import State
from tests.control.reconcile.day import Day


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
        ("after[1]", "no job 'nobody': submit the jobs this one waits for first"),
        ("after[2]", "a job cannot wait for itself")]


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
