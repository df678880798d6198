"""Arrays over a day in memory: an array is recorded as a sweep is and run by the same reconcile, its members (jobs
<id>-<index>) dropped as earlier ones end, never more than max_parallel live; each member's run is told its index
where the agent builds its environment; a cancel of the array cancels every member not ended."""

from __future__ import annotations

from pathlib import Path

from jobplane.agent.environment import Environment
from jobplane.agent.layout import Cluster, Layout
from jobplane.agent.output import OutputLog
from jobplane.agent.run import Run
from jobplane.model import keys
from jobplane.model.states import TERMINAL, State
from jobplane.store.registry import JobNotFound
from jobplane.sweeps import ops, run, store
from jobplane.sweeps.record import SweepState
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import launch_drops, queued, record, start

MEMBERS = [f"a-{i}" for i in range(10)]


def live(day: Day) -> list[str]:
    """The members not ended: a drop in queue/, or a job record in a live state."""
    out = []
    for job_id in MEMBERS:
        try:
            if day.job(job_id).state not in TERMINAL:
                out.append(job_id)
        except JobNotFound:
            if job_id in queued(day):
                out.append(job_id)
    return out


def run_env(day: Day, job_id: str, tmp_path: Path) -> dict[str, str]:
    """The variables the member's run sees, as the agent on its VM builds them from the job's record."""
    record, layout = day.job(job_id), Layout(tmp_path / job_id)
    layout.config_dir.mkdir(parents=True)  # as the agent's fetch leaves it
    env = Environment(day.reg, layout, OutputLog(None), environ={"PATH": "/usr/bin"},
                      supervise=lambda process, spec: NotImplemented, retry=lambda what, move: move())
    return env.configure(Run(job_id, record.attempt, 0, record.instances[0], day.clock()), record.spec,
                         Cluster(("10.0.0.1",), "10.0.0.1", 29500, 1, "t3.micro"))


def test_an_array_of_10_runs_each_member_once_never_more_than_3_live(day: Day, tmp_path: Path) -> None:
    assert day.submit("a", "array: {size: 10, max_parallel: 3}\n") == "array"
    assert queued(day) == ["a-0", "a-1", "a-2"]
    assert not day.reg.exists("a")  # an array is not a job
    launches: list[str] = []
    most = len(live(day))
    running: list[str] = []
    while record(day, "a").state == SweepState.RUNNING:
        launched = launch_drops(day)
        launches += launched
        if launched:
            start(day, *launched)
            running += launched
        most = max(most, len(live(day)))
        day.exits(running.pop(0), 0, 0)  # the oldest member ends
        day.sweeper()  # the check sees it SUCCEEDED; the array's reconcile drops the next member in the same run
        most = max(most, len(live(day)))
    assert most == 3
    assert launches == ["a-0", "a-1", "a-2", *MEMBERS[3:]]  # in index order, each once
    for index, job_id in enumerate(MEMBERS):
        assert [e.split()[1] for e in day.history(job_id)] == ["LAUNCHING", "RUNNING", "SUCCEEDED"]  # attempt 1 only
        assert day.vms(job_id) == {1: ["shutting-down"]} or day.vms(job_id) == {1: ["terminated"]}
        spec = day.job(job_id).spec
        assert spec.labels == {"array": "a"} and spec.array is not None and spec.array.index == index
        env = run_env(day, job_id, tmp_path)
        assert (env["JOBPLANE_ARRAY_INDEX"], env["AWS_BATCH_JOB_ARRAY_INDEX"], env["JOBPLANE_ARRAY_SIZE"]) == (
            str(index), str(index), "10")
    done = record(day, "a")
    assert done.state == SweepState.COMPLETED and done.reason == "10 members: 10 SUCCEEDED"
    assert [t.job_id for t in done.trials] == MEMBERS and done.best is None
    assert store.live(day.reg) == []  # nothing left for later runs to read
    assert ops.records(day.reg, include_finished=True) == []  # `jobplane sweep ls` lists sweeps alone


def test_an_array_with_a_failed_member_ends_failed_naming_the_counts(day: Day) -> None:
    day.submit("a", "array: {size: 3}\n")
    assert launch_drops(day) == ["a-0", "a-1", "a-2"]  # max_parallel unset: all 3 at once
    start(day, "a-0", "a-1", "a-2")
    day.exits("a-0", 0, 0)
    day.exits("a-1", 0, 3)
    day.exits("a-2", 0, 0)
    day.sweeper()
    assert day.job("a-1").state == State.FAILED
    done = record(day, "a")
    assert done.state == SweepState.FAILED and done.reason == "3 members: 2 SUCCEEDED, 1 FAILED"
    assert [(o.result, o.detail) for o in day.swept] == [(run.Result.ENDED, "FAILED: 3 members: 2 SUCCEEDED, "
                                                                             "1 FAILED")]


def test_cancelling_the_array_cancels_every_member_not_ended_and_drops_no_more(day: Day) -> None:
    day.submit("a", "array: {size: 10, max_parallel: 3}\n")
    launch_drops(day)
    start(day, "a-0", "a-1")  # a-2 is still LAUNCHING: its VM boots
    day.exits("a-0", 0, 0)
    day.sweeper()  # a-0 SUCCEEDED, a-3 dropped
    assert queued(day) == ["a-3"] and day.job("a-2").state == State.LAUNCHING

    cancelled = ops.cancel(day.reg, "a", lambda: day.compute, now=day.clock())
    assert cancelled.state == SweepState.CANCELLED
    assert [day.job(j).state for j in ("a-0", "a-1", "a-2", "a-3")] == [
        State.SUCCEEDED, State.CANCELLED, State.CANCELLED, State.CANCELLED]
    assert day.reg.get_json(keys.stop_request("a-1"))["reason"] == "cancel"  # its agents checkpoint and stop
    assert day.vms("a-2") == {1: ["shutting-down"]}  # a member that had not started never runs
    assert store.live(day.reg) == []
    assert launch_drops(day) == [] and queued(day) == []  # a-3's drop went with its cancel
    day.sweeper()
    assert day.swept == [] and live(day) == []
    assert [j for j in MEMBERS if day.reg.exists(j)] == ["a-0", "a-1", "a-2", "a-3"]  # a-4 on never dropped
