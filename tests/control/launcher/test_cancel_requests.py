"""A team member's cancel, over a day in memory (issue 57): its credentials (the stack's submitter policy, evaluated
as the local moto evaluates a member's session: tests.helpers.member_store) may write neither a job's record nor its
stop request, so `cancel` asks the functions with a request in its team's cancels/<team>/; the launcher carries it
out on the request's event only for a job of that team, and its backstop catches a request whose event was lost."""

from __future__ import annotations

import pytest

from jobplane.clouds.base import AccessDenied
from jobplane.control import cancels as control
from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.ops import cancels
from jobplane.store.registry import Registry
from jobplane.sweeps import ops as sweeps_ops
from jobplane.sweeps import store as sweeps_store
from tests.control.reconcile.day import Day
from tests.helpers import member_store


def member(day: Day, team: str) -> Registry:
    return Registry(member_store(day.store, team), day.reg.root)


def requested(day: Day, team: str, job_id: str) -> control.Result:
    """The launcher's run on the request's event."""
    return control.handle(day.context(), keys.cancel_request(team, job_id), now=day.clock()).result


def test_a_member_cancels_its_own_teams_running_job_through_the_functions(day: Day) -> None:
    day.drop("team-a", "mine")
    day.clock.advance(60)
    day.beat("mine")
    day.sweeper()
    a = member(day, "team-a")
    with pytest.raises(AccessDenied):  # a member writes no job record, no stop request
        cancels.cancel(a, "mine")
    assert day.job("mine").state == State.RUNNING and not day.reg.has(keys.stop_request("mine"))
    waited = cancels.request(a, "mine", wait=0, sleep=lambda s: None)
    assert waited.requested and waited.record.state == State.RUNNING  # the functions have not come to it yet
    assert requested(day, "team-a", "mine") == control.Result.CANCELLED
    record = day.job("mine")
    assert record.state == State.CANCELLED and record.reason == "cancelled by a member of team-a"
    assert day.reg.get_json(keys.stop_request("mine"))["reason"] == "cancel by team-a"  # its agents stop
    assert not day.reg.has(keys.cancel_request("team-a", "mine"))


def test_another_teams_job_is_refused_by_iam_and_by_the_functions(day: Day) -> None:
    day.drop("team-b", "theirs")
    with pytest.raises(AccessDenied):  # IAM: a request only in its own team's folder
        cancels.request(member(day, "team-a"), "theirs", wait=0)
    # a request in its own folder naming another team's job: the functions refuse it
    member(day, "team-a").put(keys.cancel_request("team-a", "theirs"), b'{"version": 1, "force": true}')
    assert requested(day, "team-a", "theirs") == control.Result.REFUSED
    assert day.job("theirs").state == State.LAUNCHING
    assert not day.reg.has(keys.cancel_request("team-a", "theirs"))
    assert day.metrics.totals["CancelsRefused"] == 1


def test_the_backstop_carries_out_a_request_whose_event_was_lost_and_a_queued_job_never_runs(day: Day) -> None:
    key = keys.queue_entry("queued", "team-a")
    day.store.put(day.reg.key(key), b"run: python3 train.py\ninstance_type: t3.micro\n")  # no event yet
    member(day, "team-a").put(keys.cancel_request("team-a", "queued"), b"not json")  # unreadable: still a cancel
    day.backstop()
    record = day.job("queued")
    assert record.state == State.CANCELLED and record.attempt == 0 and not day.compute.launches
    assert not day.reg.has(keys.cancel_request("team-a", "queued")) and not day.reg.has(key)
    assert [o.result for o in launcher.backstop(day.context(), now=day.clock(), min_age=0)] == []


def test_a_request_for_an_ended_job_or_none_is_dropped_and_a_dry_run_writes_nothing(day: Day) -> None:
    day.drop("team-a", "done")
    day.clock.advance(60)
    day.beat("done")
    day.sweeper()
    day.exits("done", 0, 0)
    day.sweeper(jobs=["done"])
    a = member(day, "team-a")
    a.put(keys.cancel_request("team-a", "done"), b"{}")
    assert requested(day, "team-a", "done") == control.Result.ENDED
    a.put(keys.cancel_request("team-a", "nobody"), b"{}")
    assert requested(day, "team-a", "nobody") == control.Result.MISSING
    day.drop("team-a", "dry")
    a.put(keys.cancel_request("team-a", "dry"), b"{}")
    ctx = day.context()
    dry = control.handle(type(ctx)(ctx.registry, ctx.compute, ctx.policy, ctx.metrics, ctx.notify, dry_run=True),
                         keys.cancel_request("team-a", "dry"), now=day.clock())
    assert dry.result == control.Result.CANCELLED and day.job("dry").state == State.LAUNCHING
    assert day.reg.has(keys.cancel_request("team-a", "dry"))


def test_a_member_cancels_its_own_teams_array_and_is_refused_another_teams(day: Day) -> None:
    for team, array in (("team-a", "ours"), ("team-b", "other")):
        key = keys.queue_entry(array, team)
        day.store.put(day.reg.key(key), b"run: python3 train.py\ninstance_type: t3.micro\narray: {size: 3}\n")
        assert launcher.handle_drop(day.context(), key, now=day.clock()).result == launcher.Result.ARRAY
    a = member(day, "team-a")
    with pytest.raises(AccessDenied):  # a member writes no sweep record
        sweeps_ops.cancel(a, "ours", None)
    cancels.ask(a, "team-a", "ours")
    assert requested(day, "team-a", "ours") == control.Result.CANCELLED
    record = sweeps_store.get(day.reg, "ours")[0]
    assert record.state == "CANCELLED" and record.reason == "cancelled by a member of team-a"
    assert all(day.job(t.job_id).state == State.CANCELLED for t in record.trials)
    cancels.ask(a, "team-a", "other")
    assert requested(day, "team-a", "other") == control.Result.REFUSED
    assert sweeps_store.get(day.reg, "other")[0].live
