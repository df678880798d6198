"""A sweep on the local cloud (issue 26's scenario): examples/sweep/sweep.yaml, a random search over the learning
rate of a script whose final loss is (log10(lr) + 2)^2 + 0.05, three trials at a time, the median rule on, cut
from the example's 12 trials to 6 (two rounds of three prove what four did; seed 3's first six draw the best lr
and a clearly bad one). The real launcher records it, the real sweeper's runs (on its schedule and on the trials'
exit reports) propose the trials and stop the losing ones; real VMs run the trials. Checked from the registry:
exactly 6 trials, never more than 3 live at once (from the trials' event times), at least one clearly bad trial
stopped early with the rule's reason, and the best trial's lr within half a decade of 0.01; and what
`jobplane sweep describe` says."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from jobplane.local.demo import REPO, CloudProcess, wait_for_no_instances
from jobplane.model.states import TERMINAL, State
from jobplane.sweeps import store
from jobplane.sweeps.record import SweepState
from tests.helpers import wait_for
from tests.local.conftest import cli_ok

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
EXAMPLE = REPO / "examples" / "sweep"


def final_loss(lr: float) -> float:
    """examples/sweep/train.py's final loss at this learning rate."""
    return (math.log10(lr) + 2) ** 2 + 0.05


def live_spans(events: list[dict[str, Any]]) -> tuple[datetime, datetime]:
    """From a trial's job record's creation to the transition that ended it."""
    created = next(datetime.fromisoformat(e["time"]) for e in events if e["kind"] == "created")
    ended = next(datetime.fromisoformat(e["time"]) for e in events if e.get("to") in TERMINAL)
    return created, ended


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans open at one instant (an end and a start at the same instant do not overlap)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = live = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


TRIALS = 6


@pytest.mark.timeout(600)
def test_a_random_sweep_runs_6_trials_3_at_a_time_stops_a_bad_one_and_finds_the_best_lr(
        cloud: CloudProcess, tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text((EXAMPLE / "sweep.yaml").read_text().replace("max_trials: 12", f"max_trials: {TRIALS}"))
    submitted = cloud.cli("submit", str(spec), "--code", str(EXAMPLE), "--id", "lr-search")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "lr-search" and "jobplane sweep describe lr-search" in submitted.stderr
    reg = cloud.registry()

    def ended() -> bool:
        return store.exists(reg, "lr-search") and not store.get(reg, "lr-search")[0].live

    wait_for("the sweep to end", ended, timeout=500, every=2)
    record = store.get(reg, "lr-search")[0]
    assert record.state == SweepState.COMPLETED, record.reason
    assert [t.job_id for t in record.trials] == [f"lr-search-t{n:03d}" for n in range(1, TRIALS + 1)]
    jobs = {t.job_id: reg.job(t.job_id) for t in record.trials}
    assert all(job.state in TERMINAL for job in jobs.values())
    assert all(job.spec.labels == {"project": "demo", "sweep": "lr-search", "trial": str(t.number)}
               and job.spec.hyperparameters == t.params for t, job in zip(record.trials, jobs.values(), strict=True))
    assert most_at_once([live_spans(reg.events(job_id)) for job_id in jobs]) <= 3

    stopped = {job_id: job for job_id, job in jobs.items() if job.cause == "sweep-early-stop"}
    assert set(stopped) == set(record.stopped)
    clearly_bad = [job_id for job_id in stopped if final_loss(float(record.trial(job_id).params["lr"])) > 1.5]  # type: ignore[union-attr]
    assert clearly_bad, {j: (record.trial(j), job.reason) for j, job in jobs.items()}
    for job_id in stopped:
        assert jobs[job_id].state == State.CANCELLED and "median" in (jobs[job_id].reason or "")
        assert jobs[job_id].reason == record.stopped[job_id]

    best = record.best
    assert best is not None and jobs[best.job_id].state == State.SUCCEEDED
    assert abs(math.log10(float(best.params["lr"])) + 2) < 0.5, best
    assert best.objective == pytest.approx(final_loss(float(best.params["lr"])), abs=1e-5)
    assert best.artifacts == f"teams/default/{best.job_id}/artifacts/model/"
    succeeded = [t for t in record.trials if t.state == State.SUCCEEDED]
    assert best.objective == min(t.objective for t in succeeded if t.objective is not None)

    described = json.loads(cli_ok(cloud, "sweep", "describe", "lr-search", "--json"))
    assert described["trials"][0]["job_id"] == best.job_id and len(described["trials"]) == TRIALS
    assert described["cost"]["instance_hours"] > 0
    assert "lr-search" in cli_ok(cloud, "ls", "--all")
    assert wait_for_no_instances(cloud, 120) == []
