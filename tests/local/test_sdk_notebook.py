"""The SDK as a notebook uses it, against the local AWS cloud, in this process: the environment `source
.jobplane/env.sh` sets (as before starting Jupyter), then Client(). The demo job with its code and a
hyperparameter runs to SUCCEEDED, trained at that learning rate; its loss fell, its logs are its lines, its
artifact and cost are there. Once it runs, 6 tiny jobs submitted at once from a thread pool (under three owners,
so no owner's quota of 8 makes any of them wait) all run beside it, each its own: distinct ids, each printing its
own id.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jobplane import Client
from jobplane.local.demo import REPO, CloudProcess
from jobplane.sdk import State

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs

# 6 agents booting at once on a loaded 2-core machine may take longer than the policy's 60 s to beat first
TINY = {"name": "tiny", "instance_type": "t3.micro", "spot": True, "run": "echo hi from $JOBPLANE_JOB_ID",
        "boot_timeout": "5m", "labels": {"suite": "notebook"}}
# A burst from threads, as a notebook's pool sends it: twenty in-process threads get twenty ids in
# tests/sdk/test_sdk.py; here the jobs also boot and run at once, each its own, which six (two an owner) show as well
# as twenty, at a third of the VMs.
BURST = 6


@pytest.mark.timeout(400)
def test_a_notebook_runs_the_demo_and_a_burst_of_jobs_at_once(cloud: CloudProcess, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in cloud.exported.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    client = Client()
    job = client.submit(REPO / "examples" / "demo.yaml", code=REPO / "examples" / "train",
                        hyperparameters={"lr": 0.02})
    assert job.view.state == State.QUEUED and job.view.spec is not None
    assert job.view.spec.hyperparameters == {"lr": 0.02} and job.view.spec.owner == "demo"

    assert job.wait(300, "running", interval=1) in (State.RUNNING, State.SUCCEEDED), job.reason  # booted alone
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        tiny = list(pool.map(lambda i: client.submit(TINY, owner=f"team-{i % 3}"), range(BURST)))
    assert len({t.id for t in tiny}) == BURST

    assert job.wait(300, interval=1) is State.SUCCEEDED, job.reason
    loss = job.metrics()["loss"]
    # the last point is the done line's full value; each step's line rounds it to 6 digits
    assert loss.last < loss.points[0].value and loss.last == pytest.approx(loss.min, rel=1e-4) and len(loss.points) > 10
    lines = list(job.logs())
    assert "starting from step 0" in lines and any(line.startswith("step 200 loss ") for line in lines)
    assert "learning rate 0.02" in lines  # the hyperparameter, not the script's default
    attempts = set(range(1, job.view.attempt + 1))  # a boot slowed past its timeout by the load is tried again
    assert {line.rank for line in lines} == {0} and {line.attempt for line in lines} <= attempts
    assert [a.path for a in job.artifacts()] == ["model/result.json"]
    (result,) = job.download(tmp_path)
    assert json.loads(result.read_text())["steps"] == 200
    assert job.cost().instance_hours > 0

    for t in tiny:
        assert t.wait(120, interval=1) is State.SUCCEEDED, f"{t.id}: {t.reason}"
        assert f"hi from {t.id}" in list(t.logs()), t.id
    listed = client.list(label="suite=notebook", include_finished=True)
    assert sorted(j.id for j in listed) == sorted(t.id for t in tiny)
    assert {j.view.spec.owner for j in listed if j.view.spec} == {"team-0", "team-1", "team-2"}
    print(f"the notebook's jobs ran in {time.monotonic() - started:.0f} s")
