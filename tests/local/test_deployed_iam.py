"""The functions run under their roles as `cdk synth` defines them (jobplane.local.stack_iam) on the local AWS cloud,
and under what infra/gcp grants their service account (jobplane.local.module_iam) on the local GCP one: a cloud whose
launcher role (AWS) or functions' custom role (GCP) lacks one grant fails the launch, naming the action, as the
cloud would. Every other scenario runs with the full template's roles and the whole module's grants, so passing
them proves the grants suffice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobplane.local import module_iam, stack_iam
from jobplane.local.demo import CloudProcess
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import running, submit, write_spec
from tests.warm import Warm

pytestmark = pytest.mark.scenario
REMOVED = "TagOnlyWhileLaunching"  # ec2:CreateTags on the new instance and volume, while RunInstances tags them


def without(export: dict[str, Any], function: str, sid: str) -> dict[str, Any]:
    """The export with the statement `sid` taken out of the function's role."""
    docs = export["functions"][function]
    kept = [{**doc, "Statement": [st for st in doc["Statement"] if st.get("Sid") != sid]} for doc in docs]
    assert sum(map(len, (d["Statement"] for d in kept))) == sum(map(len, (d["Statement"] for d in docs))) - 1
    return {**export, "functions": {**export["functions"], function: kept}}


def running_with(tmp_path_factory: pytest.TempPathFactory, warm: Warm, which: str, env: str,
                 export: dict[str, Any]) -> Iterator[CloudProcess]:
    """A local cloud whose functions' grants are `export` (named by the variable `env` at its start)."""
    path = tmp_path_factory.mktemp("grants") / "export.json"
    path.write_text(json.dumps(export))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(env, str(path))
        yield from running(tmp_path_factory, which, warm)


@pytest.fixture(scope="module")
def short_of_a_grant(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Iterator[CloudProcess]:
    yield from running_with(tmp_path_factory, warm, "aws", stack_iam.EXPORT_ENV,
                            without(stack_iam.load(), "launcher", REMOVED))


@pytest.mark.timeout(120)
def test_a_launcher_role_without_create_tags_fails_the_launch_naming_the_action(short_of_a_grant: CloudProcess,
                                                                              tmp_path: Path) -> None:
    cloud = short_of_a_grant
    job_id = submit(cloud, write_spec(tmp_path, "untagged", "python3 train.py --steps 1"))
    reg = cloud.registry()
    log = cloud.state_dir / "functions.log"
    wait_for("the launcher's denied RunInstances", lambda: "ec2:CreateTags" in log.read_text(), 60)
    text = log.read_text()
    assert "UnauthorizedOperation" in text and "assumed-role/jobplane-launcher/" in text, text[-3000:]
    assert reg.job(job_id).state in (State.QUEUED, State.LAUNCHING, State.FAILED)
    assert not reg.job(job_id).instances  # nothing launched


GCP_REMOVED = "compute.instances.setLabels"  # functions_own_vms': the labels a launch sets on its new VMs


@pytest.fixture(scope="module")
def gcp_short_of_a_grant(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Iterator[CloudProcess]:
    grants = module_iam.read_module()
    assert GCP_REMOVED in grants.own_vms
    yield from running_with(tmp_path_factory, warm, "gcp", module_iam.EXPORT_ENV,
                            {**grants.export(), "own_vms": sorted(grants.own_vms - {GCP_REMOVED})})


@pytest.mark.timeout(120)
def test_a_gcp_functions_role_without_set_labels_fails_the_launch_naming_the_permission(
        gcp_short_of_a_grant: CloudProcess, tmp_path: Path) -> None:
    cloud = gcp_short_of_a_grant
    job_id = submit(cloud, write_spec(tmp_path, "unlabelled", "python3 train.py --steps 1", cloud="gcp",
                                      instance_type="e2-standard-2"))
    log = cloud.state_dir / "functions.log"
    wait_for("the launcher's refused insert", lambda: GCP_REMOVED in log.read_text(), 60)
    text = log.read_text()
    assert f"Required '{GCP_REMOVED}' permission for 'projects/" in text, text[-3000:]
    assert cloud.registry().job(job_id).state in (State.QUEUED, State.LAUNCHING, State.FAILED)
    assert not cloud.registry().job(job_id).instances  # nothing launched
