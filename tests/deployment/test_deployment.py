"""jobplane.deployment.context.build: what every function invocation starts from, over any cloud's adapters."""

from __future__ import annotations

from typing import Any

import pytest

from jobplane.clouds.base import Notice
from jobplane.clouds.gcp import GceCompute
from jobplane.clouds.memory import MemoryStore
from jobplane.deployment.context import Adapters, build
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model.policy import GcpPlacement, Policy
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.settings import Settings

SETTINGS = Settings("registry", "team-a", "eu-west-1", notify_topic="jobs")


class Topic:
    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def publish(self, notice: Notice) -> None:
        self.notices.append(notice)


def test_the_policy_under_the_root_reaches_the_compute_factory_and_ends_are_announced() -> None:
    store, topic, made = MemoryStore(), Topic(), []
    store.put("team-a/config/policy.yaml", b"safety:\n  dry_run: true\n")

    def compute(settings: Settings, policy: Policy) -> Any:
        made.append((settings, policy))
        return object()  # a Compute adapter the build only passes on

    adapters = Adapters(store=lambda settings: store, compute=compute,
                        notifier=lambda settings: topic if settings.notify_topic else None)
    metrics = CountingMetrics()
    env = build(SETTINGS, adapters, metrics)
    assert env.policy.safety.dry_run and made == [(SETTINGS, env.policy)] and env.settings == SETTINGS

    env.registry.create_job("j1", parse_spec("instance_type: t3.micro\nrun: x\n", "j1"))
    assert store.get("team-a/jobs/j1/job.json")  # the registry is rooted where the settings say
    env.registry.transition("j1", State.CANCELLED, reason="cancelled by the user before it started")
    assert [n.data["state"] for n in topic.notices] == ["CANCELLED"]
    assert metrics.totals["NotificationsPublished"] == 1


def test_without_a_topic_nothing_is_published() -> None:
    store, metrics = MemoryStore(), CountingMetrics()
    env = build(Settings("registry"), Adapters(store=lambda s: store, compute=lambda s, p: object(),
                                               notifier=lambda s: None), metrics)
    env.registry.create_job("j2", parse_spec("instance_type: t3.micro\nrun: x\n", "j2"))
    assert env.registry.transition("j2", State.CANCELLED, reason="cancelled").state == State.CANCELLED
    assert not env.notify.publish(Notice("s", "t", {})) and not metrics.totals


def test_compute_engine_takes_the_policy_project_else_the_settings_and_says_what_is_missing() -> None:
    settings = Settings("reg", cloud="gcp", region="us-central1", project="from-env", compute_endpoint="http://127.0.0.1:9")
    assert GceCompute.from_settings(settings, GcpPlacement(project="from-policy")).project == "from-policy"
    assert GceCompute.from_settings(settings, GcpPlacement()).project == "from-env"
    with pytest.raises(ValueError, match=r"GOOGLE_CLOUD_PROJECT .*JOBPLANE_REGION"):
        GceCompute.from_settings(Settings("reg", cloud="gcp", project="p"), GcpPlacement())
