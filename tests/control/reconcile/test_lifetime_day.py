"""A job's whole life is bounded (issue 37, G3), through a day in memory (tests/control/reconcile/day.py).

Before: `max_wait: 3000000d` was accepted; once the job had to wait for capacity, the launch decision computed
created_at + max_wait, which is past the year 9999 and raised OverflowError after the claim was written, so every
later sweep's resume raised again and the job sat in LAUNCHING with no VM for ever. Now every duration has a
ceiling, the policy caps max_wait (max_wait_ceiling) and the attempts of a job (max_attempts_per_job), and a launch
that cannot be decided ends the job FAILED with the error. A record accepted before the ceilings (an older version
wrote it) is still read, and held to them by the decisions."""

from __future__ import annotations

from typing import Any

from jobplane.decide.model import Rule
from jobplane.decide.rules import LaunchCause
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.spec import SpotOptions, parse_spec
from jobplane.model.states import State
from tests.control.reconcile.day import Day

HUGE = 3_000_000 * 86400  # 3000000d: created_at + this is past the year 9999


def rules(outcomes: list[Any]) -> list[tuple[str, str]]:
    return [(o.action.rule, o.result) for o in outcomes if o.action.rule != Rule.CLEANUP]


def wedged_before_the_fix(day: Day, job_id: str, **huge: Any) -> JobRecord:
    """A job an older version accepted with these durations, claimed by a launcher that then raised: LAUNCHING,
    attempt 1, no VM (what `max_wait: 3000000d` left behind once the job had to wait)."""
    spec = parse_spec("run: python3 train.py\ninstance_type: t3.micro\nspot: {fallback: on_demand}\n", job_id=job_id)
    assert isinstance(spec.spot, SpotOptions)
    after = huge.pop("after", spec.spot.after)
    spec = spec.model_copy(update={**huge, "spot": spec.spot.model_copy(update={"after": after})})  # unchecked
    day.reg.create_job(job_id, spec, day.clock())
    return day.reg.transition(job_id, State.LAUNCHING, now=day.clock(), expect={State.QUEUED}, expect_attempt=0,
                              attempt=1, reason="launching attempt 1", cause=LaunchCause.SUBMITTED)


def test_a_huge_max_wait_is_refused_at_submission_naming_the_field(day: Day) -> None:
    day.compute.fail("t3.micro")  # it would have to wait: the decision that overflowed
    assert day.submit("huge", max_wait="3000000d") == "rejected"
    assert not day.reg.exists("huge"), "never recorded, never claimed"
    assert day.reg.get_json(keys.rejected_error("huge"))["errors"] == [
        {"field": "max_wait", "message": "3000000d is more than the ceiling of 90d"}]
    assert day.submit("within", max_wait="30d") == "invalid", "over the policy's max_wait_ceiling (14d)"
    assert day.job("within").reason == "max_wait: 30d exceeds the policy ceiling of 14d (max_wait_ceiling)"


def test_a_launch_that_cannot_be_decided_ends_failed_with_the_error_not_wedged(day: Day) -> None:
    wedged_before_the_fix(day, "old", after=HUGE)  # Spot refused everywhere: refused_at + after overflows
    day.compute.fail("t3.micro", spot=True)
    day.at("12:11")  # past the launch grace: the check resumes the launch, which decides again
    assert rules(day.sweeper()) == [(Rule.RESUME_LAUNCH, "applied")]
    record = day.job("old")
    assert (record.state, record.instances, record.cause) == (State.FAILED, [], LaunchCause.LAUNCH_ERROR)
    assert record.reason == ("the launch of attempt 1 could not be decided: OverflowError: date value out of range")
    assert record.last_error == record.reason
    assert day.history("old") == ["12:00 LAUNCHING", "12:11 FAILED"]
    day.at("12:30")
    assert rules(day.sweeper()) == [], "nothing left to resume"
    assert day.compute.instances(job_id="old") == [], "no VM was ever asked for"


def test_a_recorded_max_wait_past_the_ceiling_is_held_to_it(day: Day) -> None:
    wedged_before_the_fix(day, "patient", max_wait=HUGE)
    assert day.job("patient").spec.max_wait == HUGE, "read back as it was accepted"
    day.compute.fail("t3.micro", spot=True)
    day.compute.fail("t3.micro")
    day.at("12:11")
    assert rules(day.sweeper()) == [(Rule.RESUME_LAUNCH, "applied")]
    assert day.job("patient").state == State.WAITING_CAPACITY
    day.clock.advance(14 * 86400)  # the policy's max_wait_ceiling, counted from submission
    day.backstop()
    record = day.job("patient")
    assert (record.state, record.cause) == (State.FAILED, LaunchCause.MAX_WAIT)
    assert record.reason is not None and record.reason.startswith("no capacity in any zone or instance type within "
                                                                  "max_wait 14d: ")


def test_the_policy_ends_a_job_at_its_ceiling_on_attempts(day: Day) -> None:
    """max_attempts_per_job lowered after the job was accepted still holds: preemptions, a failed boot and a
    retried error each take one attempt, and none follows the last."""
    day.started("spotty", "spot: true\nretry: {max: 5, on_exit_codes: [42]}\n", max_restarts=5)
    day.reg.put(keys.POLICY, b"max_attempts_per_job: 4\n", "text/yaml")
    day.at("12:10")
    day.preempted("spotty")  # attempt 1 preempted: a rerun
    assert rules(day.rerun()) == [(Rule.RERUN, "applied")]
    day.at("12:30")  # attempt 2 never beats: past its boot timeout (15m), a boot retry
    assert rules(day.sweeper()) == [(Rule.BOOT_RETRY, "applied")]
    day.at("12:31")
    day.beat("spotty")
    assert rules(day.sweeper()) == [(Rule.STARTED, "applied")]
    day.at("12:40")
    day.exits("spotty", 0, 42)  # attempt 3 exits 42: a retry, attempt 4
    assert rules(day.sweeper()) == [(Rule.RETRY, "applied")]
    day.at("12:41")
    day.beat("spotty")
    assert rules(day.sweeper()) == [(Rule.STARTED, "applied")]
    day.at("12:50")
    day.preempted("spotty")  # restarts and retries left, but attempt 4 was the policy's last
    assert rules(day.rerun()) == [(Rule.RERUN_EXHAUSTED, "applied")]
    record = day.job("spotty")
    assert (record.state, record.attempt, record.restarts, record.retries) == (State.FAILED, 4, 2, 1)
    assert record.reason == "preempted; attempt 4 was the last the policy allows (max_attempts_per_job 4)"
