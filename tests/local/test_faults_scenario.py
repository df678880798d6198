"""The local AWS cloud under `jobplane local up --faults 0.05`: moto answers 5% of the functions', CLI's and VMs'
calls (EC2, S3, STS, SSM, SNS, the vend URL) with AWS's throttles and server errors, loses the answer of some
that took effect, refuses some multi-node launches for capacity and lists new instances up to 30 s late
(jobplane.local.api_faults). A 1-node job, a 2-node job and a Spot job preempted once all SUCCEED, with exactly
one VM per node per attempt: no launch twice (RunInstances' ClientToken, the launcher's adoption by tags), no VM
ended wrongly (a VM missing from a listing is not lost until past the grace)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID
from jobplane.local.demo import CloudProcess, wait_for_no_instances
from jobplane.model.states import State
from tests.local.conftest import cli_ok, running, shell_code, submit, write_spec
from tests.warm import Warm

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(420)]
RATE, SEED = 0.05, 61


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Iterator[CloudProcess]:
    yield from running(tmp_path_factory, "aws", warm, faults=(RATE, SEED))


def state_of(cloud: CloudProcess, job_id: str) -> State | None:
    try:
        return State(cloud.registry().job(job_id).state)
    except Exception:  # not recorded yet, or a read that met a fault past the SDK's retries: asked again
        return None


def test_three_jobs_succeed_under_faults_with_one_vm_per_node_per_attempt(faulty: CloudProcess,
                                                                          tmp_path: Path) -> None:
    code = shell_code(tmp_path)
    one = submit(faulty, write_spec(tmp_path, "one", "'sleep 8'", spot="false"), code)
    pair = submit(faulty, write_spec(tmp_path, "pair", "'sleep 8'", spot="false", num_nodes="2"), code)
    spot = submit(faulty, write_spec(tmp_path, "spot", "'sleep $([ \"$JOBPLANE_ATTEMPT\" = 1 ] && echo 600 || echo 8)'",
                                     max_restarts="2"), code)
    deadline = time.monotonic() + 180
    while state_of(faulty, spot) != State.RUNNING:
        assert time.monotonic() < deadline, f"{spot} never ran: {faulty.registry().job(spot)}"
        time.sleep(1)
    cli_ok(faulty, "local", "preempt", spot, "--grace", "5")
    for job_id in (one, pair, spot):
        done = faulty.cli("wait", job_id, "--timeout", "300s", timeout=330)
        record = faulty.registry().job(job_id)
        assert record.state == State.SUCCEEDED, f"{job_id}: {record.state} ({record.reason}); {done.stderr}"
    assert faulty.registry().job(spot).attempt == 2
    assert wait_for_no_instances(faulty, 60) == []

    vms = Counter((raw.tags.get(TAG_JOB_ID), raw.tags.get(TAG_ATTEMPT), raw.launch_index)
                  for raw in faulty.instances(managed_only=True))
    assert vms == {(one, "1", 0): 1, (pair, "1", 0): 1, (pair, "1", 1): 1, (spot, "1", 0): 1, (spot, "2", 0): 1}, vms
    logs = "".join((faulty.state_dir / log).read_text() for log in ("moto.log", "local-cloud.log"))
    faults = Counter(" ".join(line.split()[1:4]) for line in re.findall(r"^jobplane-fault .*$", logs, re.M))
    assert sum(faults.values()) > 0, "no fault was injected"
    print(f"\n--faults {RATE} --faults-seed {SEED}: {dict(sorted(faults.items()))}")
