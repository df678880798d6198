"""Count the AWS API calls one invocation makes (botocore before-call hooks) and emit them as ApiCalls."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from functions.aws import common
from jobplane.deployment.context import Deployment


@contextmanager
def api_calls(env: Deployment) -> Iterator[None]:
    clients = [c for c in (env.registry.sdk_client, getattr(env.compute, "client", None),
                           getattr(env.notify.notifier, "client", None)) if c]
    count = [0]

    def hook(**_: Any) -> None:
        count[0] += 1

    for client in clients:
        client.meta.events.register(f"before-call.{client.meta.service_model.service_name}", hook)
    try:
        yield
    finally:
        for client in clients:
            client.meta.events.unregister(f"before-call.{client.meta.service_model.service_name}", hook)
        common.metrics.add_metric(name="ApiCalls", unit="Count", value=count[0])
