"""Notifications on GCP: functions/gcp/main.py through functions-framework's test client, over the GCS and
Compute fakes, publishing to a Pub/Sub stand-in that checks each publish as the service does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from functions_framework import create_app

from jobplane.clouds.base import Notice
from jobplane.clouds.pubsub import PubSubError, PubSubNotifier
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from tests.gcp.conftest import PROJECT, GcpCloud
from tests.gcp.fake_pubsub import FakePubSub
from tests.gcp.helpers import MAIN, drop, finalized

pytestmark = pytest.mark.timeout(120)
TOPIC = f"projects/{PROJECT}/topics/jobplane-jobs"


@pytest.fixture
def pubsub(cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePubSub]:
    fake = FakePubSub((TOPIC,)).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", fake.host)
    monkeypatch.setenv("JOBPLANE_NOTIFY_TOPIC", TOPIC)
    try:
        yield fake
    finally:
        fake.stop()


@pytest.mark.parametrize(("code", "state"), [(0, State.SUCCEEDED), (3, State.FAILED)])
def test_a_job_that_ends_is_published_once(cloud: GcpCloud, pubsub: FakePubSub, code: int, state: State) -> None:
    events = create_app("launcher", MAIN, "cloudevent").test_client()
    assert events.post("/", **finalized(drop(cloud, "gcp-job"))).status_code == 200
    report = keys.exit_report("gcp-job", 1, 0)
    (vm,) = cloud.registry.job("gcp-job").instances
    cloud.registry.put_json(report, records.ExitReport(code=code, instance_id=vm).body())
    for _ in range(2):  # Eventarc delivers at least once: the second sweep finds the job ended
        assert events.post("/", **finalized("reg/" + report)).status_code == 200

    (message,) = pubsub.messages
    body = message.json()
    assert message.topic == TOPIC and message.attributes == {"event": "ended", "job_id": "gcp-job",
                                                             "state": str(state), "owner": "default"}
    assert body["state"] == state and body["logs"] == "jobplane logs gcp-job" and body["cost_basis"] == "estimated"
    # n2-standard-4 Spot on GCE: the table's on-demand price times the Spot factor, for at least a minute
    assert body["cost_usd"] == pytest.approx(0.194236 * 0.4 / 60, abs=1e-6)
    assert cloud.registry.job("gcp-job").state == state


def test_idle_gpus_are_published_by_the_scheduled_sweeper(cloud: GcpCloud, pubsub: FakePubSub) -> None:
    events = create_app("launcher", MAIN, "cloudevent").test_client()
    sweeper = create_app("sweeper", MAIN, "http").test_client()
    assert events.post("/", **finalized(drop(cloud, "idle-job"))).status_code == 200
    cloud.registry.put_json(keys.heartbeat("idle-job", 1, 0), {"time": utcnow().isoformat()})
    cloud.registry.put_json(keys.output_mark("idle-job", 1, 0), {"time": utcnow().isoformat()})
    assert [a["rule"] for a in sweeper.post("/", json={}).get_json()["actions"]] == ["started"]
    cloud.registry.put_json(keys.heartbeat("idle-job", 1, 0), {"time": utcnow().isoformat()})
    cloud.registry.put_json(keys.idle_mark("idle-job", 1, 0), {"mean_gpu_util": 1.5})
    assert [a["rule"] for a in sweeper.post("/", json={}).get_json()["actions"]] == ["idle-gpu"]
    assert sweeper.post("/", json={}).get_json()["actions"] == []

    (message,) = pubsub.messages
    assert message.attributes["event"] == "idle-gpu" and message.json()["action"] == "warn"
    assert "idle-job has idle GPUs" in message.json()["text"]


def test_the_stand_in_refuses_what_pubsub_refuses(pubsub: FakePubSub) -> None:
    notice = Notice("jobplane: x SUCCEEDED", "x SUCCEEDED\n", {"job_id": "x", "state": "SUCCEEDED"})
    with pytest.raises(PubSubError, match="HTTP 404"):
        PubSubNotifier(f"projects/{PROJECT}/topics/nobody-made-this", emulator=pubsub.host).publish(notice)
    PubSubNotifier(TOPIC, emulator=pubsub.host).publish(notice)
    assert [m.attributes for m in pubsub.messages] == [{"job_id": "x", "state": "SUCCEEDED"}]
    with pytest.raises(ValueError, match="not a Pub/Sub topic"):
        PubSubNotifier("jobplane-jobs")
