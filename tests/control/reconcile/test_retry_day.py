"""Retries on errors (the spec's retry:) through a day, in memory (see tests/control/reconcile/day.py): which endings
are retried as a new attempt that resumes from the checkpoint, which never are, and that retries and restarts are
counted apart."""

from __future__ import annotations

from pathlib import Path

from jobplane.agent.checkpoints import CheckpointSync
from jobplane.control.reconcile import Outcome
from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.ops import cancels
from tests.control.reconcile.day import Day
from tests.helpers import data_of

ON_42 = "retry: {max: 2, on_exit_codes: [42]}\n"


def rules(outcomes: list[Outcome]) -> list[tuple[str, str]]:
    return [(o.action.rule, o.result) for o in outcomes if o.action.rule != Rule.CLEANUP]


def retries(day: Day, job_id: str) -> list[dict[str, object]]:
    """The events of the claims that retried the job (the launch that follows records its VMs in another)."""
    return [e for e in day.reg.events(job_id) if "retries" in e]


def test_exit_code_42_is_retried_and_the_second_attempt_resumes_from_the_checkpoint_and_succeeds(
        day: Day, tmp_path: Path) -> None:
    day.started("flaky", ON_42, max_restarts=0)  # 12:00 launched, 12:01 RUNNING; no restarts: retries are apart
    store, prefix = day.reg.location(keys.checkpoints_prefix(data_of(day.reg, "flaky")))
    first = tmp_path / "attempt1"
    first.mkdir()
    (first / "state.pt").write_text("step 100")
    CheckpointSync(store, first, prefix, attempt=1, settle=0.0).sync(final=True)  # the agent's sync at the exit
    day.at("12:30")
    day.exits("flaky", 0, 42)
    assert rules(day.sweeper(jobs=["flaky"])) == [(Rule.RETRY, "applied")]
    retried = day.job("flaky")
    assert (retried.state, retried.attempt, retried.retries, retried.restarts) == (State.LAUNCHING, 2, 1, 0)
    assert day.vms("flaky") == {1: ["shutting-down"], 2: ["pending"]}
    claim = retries(day, "flaky")[-1]
    assert claim["reason"] == "retry 1 of 2: exit code 42 (rank 0); relaunching as attempt 2"
    assert (claim["from"], claim["to"], claim["attempt"], claim["retries"]) == ("RUNNING", "LAUNCHING", 2, 1)
    assert day.metrics.totals["Reruns"] == 1

    second = CheckpointSync(store, tmp_path / "attempt2", prefix, attempt=2, settle=0.0)  # attempt 2's agent starts
    second.restore()
    assert (tmp_path / "attempt2" / "state.pt").read_text() == "step 100", "it resumes where attempt 1 left off"
    day.at("12:32")
    day.beat("flaky")
    assert rules(day.sweeper()) == [(Rule.STARTED, "applied")]
    day.at("13:10")
    day.exits("flaky", 0, 0)
    assert rules(day.sweeper(jobs=["flaky"])) == [(Rule.FINISHED, "applied")]
    done = day.job("flaky")
    assert (done.state, done.attempt, done.retries, done.restarts, done.exit_code) == (State.SUCCEEDED, 2, 1, 0, 0)
    assert day.history("flaky") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:30 LAUNCHING 2", "12:32 RUNNING 2",
                                    "13:10 SUCCEEDED 2"]


def test_an_exit_code_not_listed_fails_the_job_and_nothing_reruns(day: Day) -> None:
    day.started("buggy", ON_42)
    day.at("12:30")
    day.exits("buggy", 0, 1)
    assert rules(day.sweeper(jobs=["buggy"])) == [(Rule.FINISHED, "applied")]
    final = day.job("buggy")
    assert (final.state, final.exit_code, final.retries, final.reason) == (State.FAILED, 1, 0,
                                                                          "rank 0 exited with code 1")
    assert [r.attempt for r in day.compute.launches] == [1]


def test_the_last_retry_used_the_next_error_fails_saying_so(day: Day) -> None:
    day.started("twice", "retry: {max: 1, on_exit_codes: [42]}\n")
    day.at("12:30")
    day.exits("twice", 0, 42)
    assert rules(day.sweeper(jobs=["twice"])) == [(Rule.RETRY, "applied")]
    day.at("12:32")
    day.beat("twice")
    day.sweeper()
    day.at("12:40")
    day.exits("twice", 0, 42)
    assert rules(day.sweeper(jobs=["twice"])) == [(Rule.FINISHED, "applied")]
    final = day.job("twice")
    assert (final.state, final.attempt, final.retries, final.exit_code) == (State.FAILED, 2, 1, 42)
    assert final.reason == "rank 0 exited with code 42; not retried: no retries left (retry.max 1)"


def test_a_vanished_on_demand_vm_is_retried_with_on_lost(day: Day) -> None:
    day.started("gone", "retry: {max: 1, on_lost: true}\n", max_restarts=0)
    day.at("12:30")
    first = day.job("gone").instances[0]
    day.compute.reclaim(first)  # no notice, no exit report: the VM is just gone
    day.at("12:33")
    assert rules(day.sweeper()) == [(Rule.RETRY, "applied")]
    retried = day.job("gone")
    assert (retried.state, retried.attempt, retried.retries, retried.restarts) == (State.LAUNCHING, 2, 1, 0)
    assert retries(day, "gone")[-1]["reason"] == \
        f"retry 1 of 1: lost: rank 0 ({first}) vanished; relaunching as attempt 2"
    day.at("12:35")
    day.beat("gone")
    day.sweeper()
    assert day.job("gone").state == State.RUNNING
    day.at("13:00")
    day.compute.reclaim(day.job("gone").instances[0])
    day.at("13:03")
    assert rules(day.sweeper()) == [(Rule.LOST, "applied")]
    final = day.job("gone")
    assert final.state == State.FAILED and final.reason is not None
    assert final.reason.endswith("vanished; not retried: no retries left (retry.max 1)")
    assert day.history("gone") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:33 LAUNCHING 2", "12:35 RUNNING 2",
                                   "13:03 FAILED 2"]


def test_a_stall_is_retried_once_then_the_job_ends_stalled(day: Day) -> None:
    day.started("quiet", "retry: {max: 1, on_stalled: true}\n", stall_timeout="30m", max_restarts=0)
    for hhmm in ("12:11", "12:21", "12:31"):  # the agent beats; the user process prints nothing more
        day.at(hhmm)
        day.beat("quiet", output=False)
        assert day.sweeper() == []
    day.at("12:32")
    assert rules(day.sweeper()) == [(Rule.RETRY, "applied")]
    assert day.vms("quiet") == {1: ["shutting-down"], 2: ["pending"]}, "the stalled attempt's VM is terminated"
    assert retries(day, "quiet")[-1]["reason"] == ("retry 1 of 1: stalled: no new output for 31m (stall_timeout "
                                                       "30m); relaunching as attempt 2")
    day.at("12:33")
    day.beat("quiet")  # attempt 2 starts and prints, then goes quiet too
    day.sweeper()
    for hhmm in ("12:43", "12:53", "13:03"):
        day.at(hhmm)
        day.beat("quiet", output=False)
        assert rules(day.sweeper()) == []
    day.at("13:04")
    assert rules(day.sweeper()) == [(Rule.STALLED, "applied")]
    final = day.job("quiet")
    assert (final.state, final.attempt, final.retries, final.restarts) == (State.STALLED, 2, 1, 0)
    assert (final.reason or "").endswith("not retried: no retries left (retry.max 1)")
    assert day.history("quiet") == ["12:00 LAUNCHING", "12:01 RUNNING", "12:32 LAUNCHING 2", "12:33 RUNNING 2",
                                    "13:04 STALLED 2"]
    assert day.metrics.totals["Stalls"] == 1 and day.metrics.totals["Reruns"] == 1


EVERYTHING = "retry: {max: 3, on_exit_codes: [42, 143], on_lost: true, on_stalled: true}\n"


def test_a_stop_on_match_is_never_retried(day: Day) -> None:
    day.started("nan", EVERYTHING + "stop_on: {nan: true}\n")
    day.at("12:30")
    day.exits("nan", 0, 42, reason="early-stop", error="train:loss became nan at step 110")
    assert rules(day.sweeper(jobs=["nan"])) == [(Rule.EARLY_STOP, "applied")]
    final = day.job("nan")
    assert (final.state, final.retries) == (State.FAILED, 0) and [r.attempt for r in day.compute.launches] == [1]


def test_a_cancelled_job_is_never_retried(day: Day) -> None:
    day.started("unwanted", EVERYTHING)
    day.at("12:30")
    cancels.cancel(day.reg, "unwanted")
    day.exits("unwanted", 0, 143, reason="stopped", stopped_by="cli", stop_reason="cancel")
    day.at("12:33")
    assert rules(day.sweeper(jobs=["unwanted"])) == []
    assert day.job("unwanted").state == State.CANCELLED and [r.attempt for r in day.compute.launches] == [1]


def test_the_uptime_cap_is_never_retried_neither_its_stop_nor_its_backstop(day: Day) -> None:
    day.started("long", EVERYTHING, max_runtime="1h")  # 12:00 launched, 12:01 RUNNING
    day.at("12:54")
    assert rules(day.uptime_cap()) == [(Rule.STOP, "applied")]
    day.exits("long", 0, 143, reason="stopped", stopped_by="uptime-cap")  # 143 is listed: a stop is no error
    assert rules(day.sweeper(jobs=["long"])) == [(Rule.STOPPED, "applied")]
    assert day.job("long").state == State.TIMED_OUT

    day.started("dead-agent", EVERYTHING, max_runtime="1h")  # 12:54 launched, 12:55 RUNNING
    day.at("13:50")  # the agent died; the VM's own shutdown backstop ends it just before the uptime-cap run
    day.compute.reclaim(day.job("dead-agent").instances[0])
    day.at("13:53")
    assert rules(day.sweeper()) == [(Rule.LOST, "applied")]
    final = day.job("dead-agent")
    assert final.state == State.FAILED and (final.reason or "").endswith("not retried: attempt 1 was at its uptime "
                                                                        "cap (1h)")
    assert [r.attempt for r in day.compute.launches] == [1, 1], "no second attempt of either"


def test_restarts_and_retries_are_counted_apart(day: Day) -> None:
    day.started("both", "retry: {max: 1, on_exit_codes: [42]}\n", spot="true", max_restarts=1)
    day.at("12:20")
    day.preempted("both")
    assert rules(day.rerun(jobs=["both"])) == [(Rule.RERUN, "applied")]
    day.at("12:22")
    day.beat("both")
    day.sweeper()
    day.at("12:40")
    day.exits("both", 0, 42)
    assert rules(day.sweeper(jobs=["both"])) == [(Rule.RETRY, "applied")]
    after = day.job("both")
    assert (after.attempt, after.restarts, after.retries) == (3, 1, 1), "neither budget spent the other's"
