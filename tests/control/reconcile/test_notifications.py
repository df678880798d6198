"""Notifications on AWS: the real handlers, moto's SNS delivering to an SQS subscription (what an e-mail or a
chat integration would get). One message when a job ends (SUCCEEDED, FAILED, INVALID), one when it is flagged
for idle GPUs, and exactly one per end however many reconcilers race for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from functions.aws import deployment, launcher, sweeper
from jobplane.control import reconcile
from jobplane.decide import check as check_decide
from jobplane.deployment.context import Context as RunContext
from jobplane.deployment.notify import Notify
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.settings import Settings
from jobplane.store.registry import Registry
from tests.helpers import LambdaContext as Context
from tests.moto_aws import REGION, SCHEDULED, SPEC, MotoAws, beat, created, launch, report_exit

pytestmark = pytest.mark.timeout(120)


class Inbox:
    """An SQS queue subscribed to the topic: what subscribers receive."""

    def __init__(self) -> None:
        sns, self.sqs = boto3.client("sns", region_name=REGION), boto3.client("sqs", region_name=REGION)
        self.topic = sns.create_topic(Name="jobplane-jobs")["TopicArn"]
        self.url = self.sqs.create_queue(QueueName="inbox")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=arn)

    def take(self) -> list[dict[str, Any]]:
        """Every message delivered so far (SNS envelopes), removed from the queue."""
        out = []
        while batch := self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages", []):
            for message in batch:
                out.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
        return out


@pytest.fixture
def inbox(moto_aws: MotoAws, monkeypatch: pytest.MonkeyPatch) -> Iterator[Inbox]:
    box = Inbox()
    monkeypatch.setenv("JOBPLANE_NOTIFY_TOPIC", box.topic)
    deployment._notifiers.clear()
    yield box
    deployment._notifiers.clear()


def data(envelope: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(envelope["Message"]))


@pytest.mark.parametrize(("code", "state", "reason"), [(0, "SUCCEEDED", "every rank exited 0"),
                                                        (2, "FAILED", "rank 0 exited with code 2")])
def test_a_job_that_ends_is_announced_once_with_state_reason_runtime_cost_and_logs(
        moto_aws: MotoAws, inbox: Inbox, code: int, state: str, reason: str) -> None:
    record = launch(moto_aws, "train")
    beat(moto_aws, record)
    sweeper.handler(SCHEDULED, Context())  # RUNNING: no message
    assert inbox.take() == []
    report = keys.exit_report("train", 1, 0)
    report_exit(moto_aws, record, code)
    sweeper.handler(created(report), Context())
    sweeper.handler(SCHEDULED, Context())  # a later run sees an ended job: nothing more

    (envelope,) = inbox.take()
    assert envelope["Subject"] == f"jobplane: train {state}"
    body = data(envelope)
    assert (body["event"], body["job_id"], body["state"], body["reason"]) == ("ended", "train", state, reason)
    assert body["owner"] == "default" and body["logs"] == "jobplane logs train" and body["runtime_s"] >= 0
    assert body["cost_usd"] == pytest.approx(0.0104 / 60, abs=1e-6) and body["cost_basis"] == "estimated"  # 1 min
    assert f"train {state}: {reason}" in body["text"] and "estimated cost ~$0.0002" in body["text"]
    assert envelope["MessageAttributes"]["state"]["Value"] == state


def test_an_invalid_drop_is_announced_by_the_launcher(moto_aws: MotoAws, inbox: Inbox) -> None:
    moto_aws.set_policy(f"allowed_instance_types: ['c5.*']\naws:\n  default_image: {moto_aws.image}\n")
    moto_aws.drop("too-big", SPEC, owner="team-a")
    assert [o["result"] for o in launcher.handler(created("queue/team-a/too-big.yaml"), Context())["outcomes"]] \
        == ["invalid"]
    (envelope,) = inbox.take()
    body = data(envelope)
    assert (body["state"], body["owner"]) == ("INVALID", "team-a") and "instance_type" in body["reason"]


def test_idle_gpus_are_announced_once_per_attempt(moto_aws: MotoAws, inbox: Inbox) -> None:
    record = launch(moto_aws, "idle")
    beat(moto_aws, record)
    sweeper.handler(SCHEDULED, Context())  # started: limits written
    moto_aws.registry.put_json(keys.heartbeat("idle", 1, 0), {"time": utcnow().isoformat()})
    moto_aws.registry.put_json(keys.idle_mark("idle", 1, 0), {"mean_gpu_util": 0.0})
    result = sweeper.handler(SCHEDULED, Context())
    assert [(a["rule"], a["result"]) for a in result["actions"]] == [("idle-gpu", "applied")]
    assert sweeper.handler(SCHEDULED, Context())["actions"] == []  # flagged: not read, not announced again

    (envelope,) = inbox.take()
    assert envelope["Subject"] == "jobplane: idle has idle GPUs"
    body = data(envelope)
    assert body["event"] == "idle-gpu" and body["action"] == "warn" and body["state"] == "RUNNING"
    assert "GPU utilization under 5% on every rank for 30m" in body["text"]
    assert [e["kind"] for e in moto_aws.registry.events("idle")].count("idle-gpu") == 1
    assert moto_aws.registry.job("idle").state == State.RUNNING  # warn: it keeps running


def test_overlapping_reconcilers_announce_an_end_exactly_once(moto_aws: MotoAws, inbox: Inbox) -> None:
    report_exit(moto_aws, launch(moto_aws, "raced"), 0)
    notify = Notify(deployment.notifier(Settings.from_env()), CountingMetrics())
    runs = []
    for _ in range(3):  # three runs that listed and decided before any of them applied
        reg = Registry(moto_aws.registry.store, listeners=[notify.transition])
        snap = reconcile.with_records(reg, reconcile.listings(reg, moto_aws.compute), ["raced"])
        runs.append((reg, check_decide.decide(snap, utcnow(), reg.policy())))
    results = [reconcile.apply(RunContext(reg, moto_aws.compute, reg.policy(), CountingMetrics()), actions,
                               now=utcnow()) for reg, actions in runs]
    assert [o.result for o in results[0]] == [reconcile.Result.APPLIED]
    assert all(o.result == reconcile.Result.SKIPPED for res in results[1:] for o in res)
    assert [data(m)["state"] for m in inbox.take()] == ["SUCCEEDED"]
    assert notify.metrics.totals == {"NotificationsPublished": 1}  # type: ignore[attr-defined]


def test_a_failed_publish_is_counted_and_never_undoes_the_transition(moto_aws: MotoAws, inbox: Inbox) -> None:
    record = launch(moto_aws, "unheard")
    metrics = CountingMetrics()

    class Down:
        def publish(self, notice: Any) -> None:
            raise ConnectionError("topic unreachable")

    reg = Registry(moto_aws.registry.store, listeners=[Notify(Down(), metrics).transition])
    reg.transition(record.id, State.CANCELLED, reason="by test")
    assert reg.job(record.id).state == State.CANCELLED and metrics.totals == {"NotificationsFailed": 1}
    assert inbox.take() == []
