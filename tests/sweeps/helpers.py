"""A sweep's day in memory (tests/control/reconcile/day.py): trials launched from their drops, printing their objective,
ending, preempted, as the launcher, the agents and the sweeper would make them."""

from __future__ import annotations

from datetime import timedelta

from jobplane.model import keys, metrics
from jobplane.model.metrics import Point
from jobplane.model.states import State
from jobplane.sweeps import store
from jobplane.sweeps.record import SweepRecord
from tests.control.reconcile.day import Day
from tests.helpers import data_of


def sweep_spec(*, max_trials: int = 4, max_parallel: int = 2, early_stop: str = "", extra: str = "",
               parameters: str = "    lr: {loguniform: [0.0001, 0.1]}\n") -> str:
    """A sweep section under Day.submit's template (run and instance_type)."""
    return ("sweep:\n  parameters:\n" + parameters + f"  max_trials: {max_trials}\n  max_parallel: {max_parallel}\n"
            "  objective: {metric: loss, goal: minimize}\n  seed: 7\n" + early_stop + extra)


def record(day: Day, sweep_id: str) -> SweepRecord:
    return store.get(day.reg, sweep_id)[0]


def queued(day: Day) -> list[str]:
    """The job ids of the drops waiting in queue/."""
    return sorted(d.job_id for k, _, _ in day.reg.listing(keys.QUEUE) if (d := keys.parse_drop(k)))


def launch_drops(day: Day) -> list[str]:
    """The launcher takes every drop in queue/ (as their object-created events deliver them); the ids launched."""
    return sorted(o.subject.removeprefix(keys.QUEUE).removesuffix(".yaml") for o in day.backstop()
                  if o.result == "launched")


def start(day: Day, *job_ids: str) -> None:
    """A minute later the trials' ranks beat and the sweeper sees them RUNNING."""
    day.clock.advance(60)
    for job_id in job_ids:
        day.beat(job_id)
    day.sweeper()
    assert all(day.job(j).state == State.RUNNING for j in job_ids), [day.job(j).state for j in job_ids]


def prints(day: Day, job_id: str, losses: dict[int, float], *, seq: int = 0) -> None:
    """Rank 0 of the job's current attempt printed `step N loss X` for each (step, loss); the agent shipped it."""
    attempt = day.job(job_id).attempt
    data = b"".join(metrics.encode(Point("loss", value, step), day.clock() + timedelta(seconds=step))
                    for step, value in sorted(losses.items()))
    day.reg.put(keys.metrics_chunk(data_of(day.reg, job_id), attempt, 0, seq), data, "application/x-ndjson")


def finish(day: Day, job_id: str, final: float | None = None) -> None:
    """The trial prints its final loss (if given) at step 1000 and exits 0."""
    if final is not None:
        prints(day, job_id, {1000: final}, seq=99)
    day.exits(job_id, 0, 0)
