"""Sweeps over a day in memory: the launcher records a sweep and drops its first trials, the sweeper's run ends
trials and proposes the next ones in the same invocation, early stops, a preempted Spot trial counted once,
cancels, rejections and a proposer that died after its compare-and-swap."""

from __future__ import annotations

from dataclasses import replace

from jobplane.control import reconcile
from jobplane.decide.rules import Rule
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.sweeps import run, store
from jobplane.sweeps.record import SweepState
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import finish, launch_drops, prints, queued, record, start, sweep_spec


def test_a_sweep_proposes_trials_as_earlier_ones_end_and_names_the_best(day: Day) -> None:
    assert day.submit("s", sweep_spec(max_trials=4, max_parallel=2)) == "sweep"
    assert queued(day) == ["s-t001", "s-t002"]
    assert not day.reg.exists("s")  # a sweep is not a job
    assert launch_drops(day) == ["s-t001", "s-t002"]
    trial = day.job("s-t001")
    assert trial.spec.labels == {"sweep": "s", "trial": "1"}
    assert set(trial.spec.hyperparameters) == {"lr"}
    assert trial.spec.hyperparameters == record(day, "s").trials[0].params
    start(day, "s-t001", "s-t002")
    assert day.swept == [] and queued(day) == []  # two live: nothing more to propose

    finish(day, "s-t001", final=0.5)
    day.sweeper()  # the job sweep ends s-t001, then the sweep reconcile proposes s-t003 in the same run
    assert day.job("s-t001").state == State.SUCCEEDED
    assert [(o.result, o.trial) for o in day.swept] == [(run.Result.PROPOSED, "s-t003")]
    assert record(day, "s").trials[0].state == State.SUCCEEDED and record(day, "s").trials[0].objective == 0.5
    assert record(day, "s").best is not None and record(day, "s").best.job_id == "s-t001"  # type: ignore[union-attr]
    launch_drops(day)
    start(day, "s-t003")
    finish(day, "s-t002", final=0.2)
    finish(day, "s-t003", final=0.9)
    day.sweeper()
    assert [(o.result, o.trial) for o in day.swept] == [(run.Result.PROPOSED, "s-t004")]
    launch_drops(day)
    start(day, "s-t004")
    finish(day, "s-t004", final=0.3)
    day.sweeper()
    done = record(day, "s")
    assert done.state == SweepState.COMPLETED
    assert [t.number for t in done.trials] == [1, 2, 3, 4]
    assert done.best is not None and done.best.job_id == "s-t002" and done.best.objective == 0.2
    assert done.best.params == done.trials[1].params
    assert done.best.artifacts == "teams/default/s-t002/artifacts/model/"
    assert done.reason == "4 trials: 4 SUCCEEDED; best s-t002 (loss 0.2)"
    assert [o.result for o in day.swept] == [run.Result.ENDED]
    assert store.live(day.reg) == []  # the marker is gone: later runs read nothing of it
    day.sweeper()
    assert day.swept == []


def test_the_median_rule_stops_a_losing_trial_with_its_reason(day: Day) -> None:
    day.submit("s", sweep_spec(max_trials=4, max_parallel=4,
                               early_stop="  early_stop: {rule: median, after_step: 100}\n"))
    launch_drops(day)
    trials = ["s-t001", "s-t002", "s-t003", "s-t004"]
    start(day, *trials)
    for job_id, loss in zip(trials, (0.40, 0.41, 0.42, 3.0), strict=True):
        prints(day, job_id, {50: loss + 0.1, 100: loss, 150: loss})
    stopped = [o for o in day.sweeper() if o.action.rule == Rule.SWEEP_STOP]
    assert [(o.action.job_id, o.result) for o in stopped] == [("s-t004", "applied")]
    bad = day.job("s-t004")
    assert bad.state == State.CANCELLED and bad.cause == "sweep-early-stop"
    assert bad.reason is not None and bad.reason == stopped[0].action.reason and "median" in bad.reason
    assert record(day, "s").stopped == {"s-t004": bad.reason}
    stop = day.reg.get_json(keys.stop_request("s-t004"))
    assert stop["by"] == "sweep" and stop["reason"] == bad.reason
    assert day.metrics.totals["SweepTrialsStopped"] == 1
    assert [e["by"] for e in day.reg.events("s-t004") if e["kind"] == "stop-requested"] == ["sweep"]
    assert not [o for o in day.sweeper() if o.action.rule == Rule.SWEEP_STOP] and day.swept == []  # stopped once


def test_early_stops_pass_the_blast_radius_limit_and_dry_run_as_every_stop(day: Day) -> None:
    """A trial stopped before its VMs run has them terminated at once: terminations the blast-radius limit counts
    (on main the sweep's stop terminated past it), and a dry run reports the stop without making it."""
    day.submit("s", sweep_spec(max_trials=4, max_parallel=4,
                               early_stop="  early_stop: {rule: median, after_step: 100}\n"))
    launch_drops(day)
    start(day, "s-t001", "s-t002", "s-t003")
    for job_id, loss in (("s-t001", 0.40), ("s-t002", 0.41), ("s-t003", 0.42), ("s-t004", 3.0)):
        prints(day, job_id, {50: loss + 0.1, 100: loss, 150: loss})  # s-t004 printed before its first beat
    assert day.job("s-t004").state == State.LAUNCHING and day.vms("s-t004") == {1: ["running"]}

    day.reg.put(keys.POLICY, b"safety: {dry_run: true}\n", "text/yaml")
    (looked,) = [o for o in day.sweeper() if o.action.rule == Rule.SWEEP_STOP]
    assert (looked.action.job_id, looked.result, looked.action.terminate) == ("s-t004", "dry-run", (
        day.job("s-t004").instances[0],))
    day.reg.put(keys.POLICY, b"safety: {max_terminations_per_run: 0}\n", "text/yaml")
    (refused,) = [o for o in day.sweeper() if o.action.rule == Rule.SWEEP_STOP]
    assert refused.result == "refused" and day.vms("s-t004") == {1: ["running"]}
    assert day.job("s-t004").state == State.LAUNCHING
    assert [e["rule"] for e in day.reg.events("s-t004") if e["kind"] == "refused"] == ["sweep-early-stop"]

    day.reg.delete(keys.POLICY)
    (done,) = [o for o in day.sweeper() if o.action.rule == Rule.SWEEP_STOP]
    assert done.result == "applied" and day.job("s-t004").state == State.CANCELLED
    assert day.vms("s-t004") == {1: ["shutting-down"]}


def test_a_preempted_spot_trial_is_rerun_and_counts_once(day: Day) -> None:
    day.submit("s", sweep_spec(max_trials=3, max_parallel=2, extra="spot: true\n"))
    launch_drops(day)
    start(day, "s-t001", "s-t002")
    prints(day, "s-t001", {100: 0.8})
    day.preempted("s-t001")
    day.rerun()
    day.sweeper()
    trial = day.job("s-t001")
    assert trial.state == State.LAUNCHING and trial.attempt == 2
    assert day.swept == [] and queued(day) == []  # still live, still trial 1: nothing new proposed
    day.clock.advance(60)
    day.beat("s-t001")
    day.sweeper()
    assert day.job("s-t001").state == State.RUNNING
    prints(day, "s-t001", {100: 0.7, 200: 0.6})  # resumed from its checkpoint at step 100
    finish(day, "s-t001", final=0.55)
    day.sweeper()
    assert [(o.result, o.trial) for o in day.swept] == [(run.Result.PROPOSED, "s-t003")]
    rec = record(day, "s")
    assert [t.job_id for t in rec.trials] == ["s-t001", "s-t002", "s-t003"]
    assert rec.trials[0].state == State.SUCCEEDED and rec.trials[0].objective == 0.55
    assert day.history("s-t001") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:01 PREEMPTED", "12:01 LAUNCHING 2",
                                     "12:02 RUNNING 2", "12:02 SUCCEEDED 2"]


def test_a_proposal_whose_drop_was_never_written_is_dropped_by_the_next_run(day: Day) -> None:
    day.submit("s", sweep_spec(max_trials=4, max_parallel=2))
    for key in [k for k, _, _ in day.reg.listing(keys.QUEUE)]:
        day.reg.delete(key)  # as if the run that proposed them died after its compare-and-swap
    day.sweeper()
    assert day.swept == []  # within a minute of the proposal: its proposer may still be writing the drops
    day.clock.advance(60)
    day.sweeper()
    assert [(o.result, o.trial) for o in day.swept] == [(run.Result.DROPPED_AGAIN, "s-t001"),
                                                        (run.Result.DROPPED_AGAIN, "s-t002")]
    assert queued(day) == ["s-t001", "s-t002"]
    day.sweeper()  # the drops are there: nothing to do
    assert day.swept == []
    launch_drops(day)
    day.sweeper()  # taken by the launcher: their records are there
    assert day.swept == [] and queued(day) == []


def test_a_sweep_the_deployment_refuses_is_rejected_naming_the_field(day: Day) -> None:
    assert day.submit("s", sweep_spec(extra="cloud: gcp\n")) == "invalid"
    error = day.reg.get_json(keys.rejected_error("s"))
    assert [e["field"] for e in error["errors"]] == ["cloud"]
    assert not store.exists(day.reg, "s") and queued(day) == [] and not day.reg.exists("s")


def test_a_sweep_id_is_never_a_jobs_nor_another_sweeps(day: Day) -> None:
    day.started("taken")
    assert day.submit("taken", sweep_spec()) == "duplicate"
    assert day.submit("s", sweep_spec()) == "sweep"
    assert day.submit("s", sweep_spec(max_trials=3)) == "duplicate"
    assert day.reg.get_json(keys.rejected_error("s"))["errors"][0]["field"] == "id"
    assert len(record(day, "s").trials) == 2


def test_a_dry_run_says_what_it_would_do_and_writes_nothing(day: Day) -> None:
    day.submit("s", sweep_spec(max_trials=4, max_parallel=2))
    launch_drops(day)
    start(day, "s-t001", "s-t002")
    finish(day, "s-t001", final=0.5)
    reconcile.check(day.context(), now=day.clock())  # the job sweep alone: s-t001 SUCCEEDED
    before = record(day, "s")
    looked = run.reconcile(replace(day.context(), dry_run=True), now=day.clock()).outcomes
    assert [(o.result, o.trial) for o in looked] == [(run.Result.DRY_RUN, "s-t003")]
    assert looked[0].detail is not None and looked[0].detail.startswith("would propose lr=")
    assert record(day, "s") == before and queued(day) == []
    day.sweeper()
    assert [(o.result, o.trial) for o in day.swept] == [(run.Result.PROPOSED, "s-t003")]
