"""The functions run under their roles as `cdk synth` defines them (jobplane.local.stack_iam): a local cloud whose
launcher role lacks one grant the template gives it fails the launch, naming the action, as AWS would. Every other
scenario on the local AWS cloud runs with the full template's roles, so passing them proves the grants suffice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobplane.local import stack_iam
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


@pytest.fixture(scope="module")
def short_of_a_grant(tmp_path_factory: pytest.TempPathFactory, warm: Warm) -> Iterator[CloudProcess]:
    export = without(stack_iam.load(), "launcher", REMOVED)
    path = tmp_path_factory.mktemp("stack-iam") / "export.json"
    path.write_text(json.dumps(export))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(stack_iam.EXPORT_ENV, str(path))
        yield from running(tmp_path_factory, "aws", warm)


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
