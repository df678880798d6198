"""Membership is the control plane's (issue 57), over a day in memory: one deployment, two teams. Only the sweep
reconcile makes array members and sweep trials; a drop that claims membership (the labels `array`, `sweep`,
`trial`, or an `array.index`) is refused naming the field unless its sweep's record, of the drop's owner, lists it
and the drop is the member's spec; a plain drop may not take a member id of an existing sweep or array; and a job is
counted as a member only if it is of the record's owner. On the code before, team A's forged `train-2` and
`exp-t003` were launched and adopted by team B's array and sweep."""

from __future__ import annotations

from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.spec import JobSpec
from jobplane.model.states import State
from jobplane.sweeps import ops, run
from jobplane.sweeps.record import SweepState
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import finish, queued, record, start, sweep_spec

BASE = "run: python3 train.py\ninstance_type: t3.micro\n"


def drop(day: Day, owner: str, job_id: str, text: str) -> launcher.Outcome:
    """The owner writes queue/<owner>/<job_id>.yaml; the launcher runs on its event."""
    key = keys.queue_entry(job_id, owner)
    day.store.put(day.reg.key(key), text.encode())
    return launcher.handle_drop(day.context(), key, now=day.clock())


def take_drops(day: Day) -> list[str]:
    """The launcher takes every drop in queue/ (as their events deliver them); the job ids it launched."""
    done = [o for o in day.backstop() if o.result == launcher.Result.LAUNCHED]
    return sorted(drop.job_id for o in done if (drop := keys.parse_drop(o.subject)) is not None)


def refused(day: Day, job_id: str) -> list[str]:
    """The fields the launcher's rejection of job_id's drop names."""
    return [e["field"] for e in day.reg.get_json(keys.rejected_error(job_id))["errors"]]


def member_spec(day: Day, sweep_id: str, job_id: str) -> JobSpec:
    """The spec the control plane made for this member of its sweep's (or array's) record."""
    made = record(day, sweep_id)
    trial = made.trial(job_id)
    assert trial is not None
    return run.trial_spec(made, trial)


def test_a_drop_claiming_another_teams_array_member_is_refused_and_the_array_runs_its_own(day: Day) -> None:
    assert drop(day, "team-b", "train", BASE + "array: {size: 3, max_parallel: 2}\n").result == launcher.Result.ARRAY
    assert queued(day) == ["train-0", "train-1"]
    forged = drop(day, "team-a", "train-2", BASE.replace("train.py", "steal.py") + "labels: {array: train}\n"
                                                   "array: {size: 3, index: 2}\n")
    assert forged.result == launcher.Result.REJECTED, forged
    assert refused(day, "train-2") == ["array.index", "labels.array"]
    assert not day.reg.exists("train-2")

    assert take_drops(day) == ["train-0", "train-1"]
    start(day, "train-0", "train-1")
    finish(day, "train-0")
    day.sweeper()  # train-0 SUCCEEDED; the array drops its member 2, team B's
    assert queued(day) == ["train-2"]
    day.sweeper()  # a run between the drop and the launcher: the rejection of the forgery is not the member's
    assert take_drops(day) == ["train-2"]
    start(day, "train-2")
    finish(day, "train-1")
    finish(day, "train-2")
    day.sweeper()
    done = record(day, "train")
    assert done.state == SweepState.COMPLETED and done.reason == "3 members: 3 SUCCEEDED"
    member = day.job("train-2")
    assert member.owner == "team-b" and member.spec == member_spec(day, "train", "train-2")
    assert member.spec.run == "python3 train.py"


def test_a_drop_claiming_another_teams_sweep_trial_is_refused_and_the_sweep_runs_its_own(day: Day) -> None:
    assert drop(day, "team-b", "exp", BASE + sweep_spec(max_trials=3, max_parallel=2)).result == \
        launcher.Result.SWEEP
    forged = drop(day, "team-a", "exp-t003", BASE + "labels: {sweep: exp, trial: \"3\"}\n")
    assert forged.result == launcher.Result.REJECTED, forged
    assert refused(day, "exp-t003") == ["labels.sweep", "labels.trial"]
    assert not day.reg.exists("exp-t003")

    assert take_drops(day) == ["exp-t001", "exp-t002"]
    start(day, "exp-t001", "exp-t002")
    finish(day, "exp-t001", final=0.5)
    day.sweeper()
    day.sweeper()  # before the launcher takes exp-t003's drop
    assert take_drops(day) == ["exp-t003"]
    start(day, "exp-t003")
    finish(day, "exp-t002", final=0.4)
    finish(day, "exp-t003", final=0.1)
    day.sweeper()
    done = record(day, "exp")
    assert done.state == SweepState.COMPLETED and [t.state for t in done.trials] == [State.SUCCEEDED] * 3
    assert done.best is not None and done.best.job_id == "exp-t003"
    assert day.job("exp-t003").owner == "team-b"
    assert day.job("exp-t003").spec == member_spec(day, "exp", "exp-t003")


def test_a_plain_drop_may_not_take_a_member_id_of_a_live_sweep_or_array(day: Day) -> None:
    assert drop(day, "team-b", "exp", BASE + sweep_spec(max_trials=3, max_parallel=1)).result == \
        launcher.Result.SWEEP
    assert drop(day, "team-b", "arr", BASE + "array: {size: 4, max_parallel: 1}\n").result == launcher.Result.ARRAY
    for squat in ("exp-t002", "arr-3"):
        assert drop(day, "team-a", squat, BASE).result == launcher.Result.REJECTED, squat
        assert refused(day, squat) == ["id"]
        assert not day.reg.exists(squat)
    # ids of neither shape, of a sweep or array that does not exist, or of the other kind's shape, are anyone's
    for free in ("exp-t02", "exp-x1", "arr-03", "other-t001", "other-1", "exp-2", "arr-t001"):
        assert drop(day, "team-a", free, BASE).result == launcher.Result.LAUNCHED, free


def test_a_member_forged_by_its_own_team_before_the_control_plane_writes_it_changes_nothing(day: Day) -> None:
    assert drop(day, "team-b", "train", BASE + "array: {size: 3, max_parallel: 1}\n").result == launcher.Result.ARRAY
    early = drop(day, "team-b", "train-1", BASE.replace("train.py", "other.py") + "labels: {array: train}\n"
                                                  "array: {size: 3, max_parallel: 1, index: 1}\n")
    assert early.result == launcher.Result.REJECTED, early
    assert refused(day, "train-1") == ["array.index", "labels.array"]
    assert take_drops(day) == ["train-0"]
    start(day, "train-0")
    finish(day, "train-0")
    day.sweeper()
    day.sweeper()  # the forgery's rejection does not end member 1
    assert record(day, "train").trials[1].state is None
    assert take_drops(day) == ["train-1"]
    assert day.job("train-1").spec == member_spec(day, "train", "train-1")
    start(day, "train-1")
    finish(day, "train-1")
    day.sweeper()
    assert take_drops(day) == ["train-2"]
    start(day, "train-2")
    finish(day, "train-2")
    day.sweeper()
    assert record(day, "train").reason == "3 members: 3 SUCCEEDED"
    assert [day.job(f"train-{i}").spec.run for i in range(3)] == ["python3 train.py"] * 3


def test_a_job_of_another_owner_is_never_a_sweeps_trial_whatever_its_labels(day: Day) -> None:
    """A job recorded before the check existed, with the label: the owner check alone keeps it out."""
    squatter = drop(day, "team-a", "solo", BASE).result
    assert squatter == launcher.Result.LAUNCHED
    spec = day.job("solo").spec.model_copy(update={"id": "exp-t002", "labels": {"sweep": "exp", "trial": "2"}})
    day.reg.create_job("exp-t002", spec, day.clock())
    assert drop(day, "team-b", "exp", BASE + sweep_spec(max_trials=2, max_parallel=2)).result == \
        launcher.Result.SWEEP
    take_drops(day)  # exp-t001; exp-t002's drop is refused as a duplicate id
    start(day, "exp-t001")
    finish(day, "exp-t001", final=0.5)
    day.sweeper()
    done = record(day, "exp")
    assert [t.state for t in done.trials] == [State.SUCCEEDED, State.INVALID]
    assert done.state == SweepState.COMPLETED and done.best is not None and done.best.job_id == "exp-t001"
    assert day.job("exp-t002").state == State.QUEUED  # team A's job: the sweep neither counts nor touches it


def test_cancelling_a_sweep_never_cancels_another_owners_job_under_a_trial_id(day: Day) -> None:
    assert drop(day, "team-a", "solo", BASE).result == launcher.Result.LAUNCHED
    spec = day.job("solo").spec.model_copy(update={"id": "exp-t002"})
    day.reg.create_job("exp-t002", spec, day.clock())  # team A's, recorded before team B's sweep existed
    assert drop(day, "team-b", "exp", BASE + sweep_spec(max_trials=2, max_parallel=2)).result == \
        launcher.Result.SWEEP
    ops.cancel(day.reg, "exp", lambda: day.compute, now=day.clock())  # before any run saw trial 2's job
    assert day.job("exp-t002").state == State.QUEUED
    assert day.job("exp-t001").state == State.CANCELLED
