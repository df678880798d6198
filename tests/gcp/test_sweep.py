"""A sweep through the GCP entry points (functions-framework test clients over the GCS and Compute fakes): the
bucket-event function records the sweep's drop and launches the trials its reconcile drops; a trial's exit report,
routed by the same function, ends the trial and proposes the next in that invocation; the scheduled sweeper ends
the sweep with its best trial."""

from __future__ import annotations

from typing import Any

import pytest
from functions_framework import create_app

from jobplane.model import keys, metrics
from jobplane.model.clock import utcnow
from jobplane.model.metrics import Point
from jobplane.model.states import State
from jobplane.sweeps import store
from jobplane.sweeps.record import SweepState
from tests.gcp.conftest import GcpCloud
from tests.gcp.helpers import MAIN, SPEC, beat, call, exit_report, finalized

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(180)]
SWEEP = ("sweep:\n  parameters:\n    lr: {loguniform: [0.0001, 0.1]}\n  max_trials: 3\n  max_parallel: 2\n"
         "  objective: {metric: loss, goal: minimize}\n")


def created(key: str) -> Any:
    """Deliver the bucket's finalized event for a registry key to the launcher function; its JSON log line's
    result is what it did (the function returns nothing)."""
    response = create_app("launcher", MAIN, "cloudevent").test_client().post("/", **finalized("reg/" + key))
    assert response.status_code == 200


def launch_queued(cloud: GcpCloud) -> list[str]:
    """Deliver every drop in queue/, as the bucket's events would; the job ids."""
    ids = []
    for key, _, _ in list(cloud.registry.listing(keys.QUEUE)):
        created(key)
        drop = keys.parse_drop(key)
        assert drop is not None
        ids.append(drop.job_id)
    return sorted(ids)


def runs(cloud: GcpCloud, job_id: str, final: float) -> None:
    """The trial starts, prints its loss and exits 0; its exit report's event reaches the launcher function."""
    record = cloud.registry.job(job_id)
    beat(cloud, record)
    call("sweeper")
    assert cloud.registry.job(job_id).state == State.RUNNING
    data = metrics.encode(Point("loss", final, 100), utcnow())
    cloud.registry.put(keys.metrics_chunk(record.data, record.attempt, 0, 0), data, "application/x-ndjson")
    exit_report(cloud, record, 0)
    created(keys.exit_report(job_id, record.attempt, 0))


def test_a_sweep_runs_through_the_gcp_functions(cloud: GcpCloud) -> None:
    key = keys.queue_entry("gs")
    cloud.registry.put(key, (SPEC + SWEEP).encode(), "application/yaml")
    created(key)
    assert [t.job_id for t in store.get(cloud.registry, "gs")[0].trials] == ["gs-t001", "gs-t002"]
    assert launch_queued(cloud) == ["gs-t001", "gs-t002"]
    assert {cloud.registry.job(j).state for j in ("gs-t001", "gs-t002")} == {State.LAUNCHING}

    runs(cloud, "gs-t001", 0.3)  # its exit report's invocation ends it and proposes trial 3
    assert cloud.registry.job("gs-t001").state == State.SUCCEEDED
    assert launch_queued(cloud) == ["gs-t003"]
    runs(cloud, "gs-t002", 0.2)
    runs(cloud, "gs-t003", 0.4)
    assert cloud.registry.job("gs-t003").state == State.SUCCEEDED
    record = store.get(cloud.registry, "gs")[0]
    assert record.state == SweepState.COMPLETED and record.best is not None and record.best.job_id == "gs-t002"
    assert store.live(cloud.registry) == [] and "sweeps" not in call("sweeper")  # ended: nothing more to do
