"""functions/aws/launcher.handler with EventBridge-shaped events on moto: routing, root prefix, JSON logs."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from jobplane.local import triggers
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.helpers import LambdaContext, publish_agent_manifest
from tests.moto_aws import BUCKET, REGION, MotoAws

pytestmark = pytest.mark.timeout(120)


def object_created(key: str, bucket: str = BUCKET) -> dict[str, Any]:
    return triggers.object_created(bucket, key, 10, REGION)


def outcome(result: dict[str, Any]) -> str:
    """The one outcome of a drop's answer."""
    (said,) = result["outcomes"]
    return str(said["result"])


SCHEDULED = triggers.scheduled("launcher", REGION)
SPEC = "instance_type: t3.micro\nrun: python train.py\n"


@contextmanager
def log_output() -> Iterator[io.StringIO]:
    """What the "jobplane" logger's handlers write during the block. Their streams are swapped rather than
    read through capsys: a handler created before capsys (another test imported common first) keeps
    writing to the stream that was sys.stdout then."""
    buf = io.StringIO()
    handlers = [h for h in logging.getLogger("jobplane").handlers if isinstance(h, logging.StreamHandler)]
    old = [h.setStream(buf) for h in handlers]
    try:
        yield buf
    finally:
        for h, stream in zip(handlers, old, strict=True):
            h.setStream(stream)


def test_object_created_launches_and_logs_json_with_job_id(moto_aws: MotoAws,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from functions.aws.launcher import handler

    moto_aws.drop("from-event", SPEC)
    with log_output() as logged:
        result = handler(object_created("queue/from-event.yaml"), LambdaContext())

    (said,) = result["outcomes"]
    assert (said["subject"], said["result"]) == ("queue/from-event.yaml", "launched")
    assert said["detail"].startswith("launched 1 x t3.micro"), said
    assert moto_aws.registry.job("from-event").state == State.LAUNCHING
    lines = [json.loads(line) for line in logged.getvalue().splitlines() if line.startswith("{")]
    core = [line for line in lines if line.get("message", "").startswith("job from-event attempt 1")
            and "service" in line]  # Powertools' lines (the GCP test's handler may share the logger)
    assert core and core[0]["job_id"] == "from-event" and core[0]["service"] == "jobplane"
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    assert emf and emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "jobplane" and emf[0]["JobsLaunched"] == [1.0]


def test_foreign_events_are_ignored(moto_aws: MotoAws) -> None:
    from functions.aws.launcher import handler

    moto_aws.drop("elsewhere", SPEC)
    assert outcome(handler(object_created("queue/elsewhere.yaml", "other-bucket"), LambdaContext())) == "ignored"
    assert outcome(handler(object_created("jobs/x/job.json"), LambdaContext())) == "ignored"
    assert moto_aws.instances() == []  # the handler's own EC2 client: count instances, not hooked calls


def test_root_prefix_is_honoured(moto_aws: MotoAws, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions.aws.launcher import handler

    monkeypatch.setenv("JOBPLANE_ROOT", "team-a")
    moto_aws.s3.put_object(Bucket=BUCKET, Key="team-a/config/policy.yaml",
                        Body=f"aws:\n  default_image: {moto_aws.image}\n".encode())
    publish_agent_manifest(Registry(moto_aws.registry.store, "team-a"), "aws")
    moto_aws.s3.put_object(Bucket=BUCKET, Key="team-a/queue/rooted.yaml", Body=SPEC.encode())
    assert outcome(handler(object_created("queue/rooted.yaml"), LambdaContext())) == "ignored"  # outside root
    assert outcome(handler(object_created("team-a/queue/rooted.yaml"), LambdaContext())) == "launched"
    assert moto_aws.s3.get_object(Bucket=BUCKET, Key="team-a/" + keys.job_record("rooted"))
    (instance,) = moto_aws.instances()
    attr = moto_aws.ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    assert "export JOBPLANE_ROOT=team-a" in base64.b64decode(attr["UserData"]["Value"]).decode()


def test_scheduled_event_runs_the_backstop(moto_aws: MotoAws) -> None:
    from functions.aws.launcher import handler

    moto_aws.drop("fresh", SPEC)
    assert handler(SCHEDULED, LambdaContext()) == {"outcomes": []}  # younger than a minute: events handle it
