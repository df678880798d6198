"""What every function invocation works with, built the same way on each cloud: the registry (announcing
transitions on the notification topic), the policy read from it, the Compute adapter and the notifier.

The entry point (functions/aws, functions/gcp) reads the Settings and passes its own cloud's Adapters, so an
AWS function never imports google and a GCP function never imports boto3; this module imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobplane.clouds.base import Compute, Notifier, ObjectStore
from jobplane.notify import Notify
from jobplane.policy import Policy
from jobplane.registry import Registry
from jobplane.settings import Settings
from jobplane.telemetry import Metrics


@dataclass(frozen=True)
class Adapters:
    """One cloud's factories. They may reuse SDK clients across invocations; what they return is per call."""
    store: Callable[[Settings], ObjectStore]
    compute: Callable[[Settings, Policy], Compute]
    notifier: Callable[[Settings], Notifier | None]  # None: no topic configured, notifications off


@dataclass(frozen=True)
class Deployment:
    settings: Settings
    registry: Registry
    compute: Compute
    policy: Policy
    notify: Notify


def build(settings: Settings, adapters: Adapters, metrics: Metrics) -> Deployment:
    """Fresh per invocation, since the policy may have changed. Every transition to an end is announced on
    the notification topic by the run whose compare-and-swap made it."""
    notify = Notify(adapters.notifier(settings), metrics)
    registry = Registry(adapters.store(settings), settings.root, listeners=[notify.transition],
                        vend_url=settings.vend_url)
    policy = registry.policy()
    return Deployment(settings, registry, adapters.compute(settings, policy), policy, notify)
