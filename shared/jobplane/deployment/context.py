"""What every function invocation works with, built the same way on each cloud: the registry (announcing
transitions on the notification topic), the policy read from it, the Compute adapter and the notifier; and the
Context a launcher or reconciler run takes, made of them.

The entry point (functions/aws, functions/gcp) reads the Settings and passes its own cloud's Adapters, so an
AWS function never imports google and a GCP function never imports boto3; this module imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobplane.clouds.base import Compute, Notifier, ObjectStore
from jobplane.deployment.notify import Notify
from jobplane.deployment.telemetry import Metrics
from jobplane.model.policy import Policy
from jobplane.settings import Settings
from jobplane.store.registry import Registry


@dataclass(frozen=True)
class Adapters:
    """One cloud's factories. They may reuse SDK clients across invocations; what they return is per call."""
    store: Callable[[Settings], ObjectStore]
    compute: Callable[[Settings, Policy], Compute]
    notifier: Callable[[Settings], Notifier | None]  # None: no topic configured, notifications off


@dataclass(frozen=True)
class Context:
    """What one launcher or reconciler run works with, besides its `now`: one value instead of the same five
    arguments at every call. Deployment.context builds it in a function; a test builds its own."""

    registry: Registry
    compute: Compute | None  # None: the run cannot reach the cloud, and an action that needs it is an error
    policy: Policy
    metrics: Metrics
    notify: Notify | None = None  # publishes idle-GPU flags (a job's end is announced by the registry's listener)
    dry_run: bool = False  # the invocation asked to look without acting

    @property
    def looking(self) -> bool:
        """Only looking: the invocation or the policy's safety.dry_run said so."""
        return self.dry_run or self.policy.safety.dry_run

    def cloud(self, what: str) -> Compute:
        """The compute adapter, for a step that needs one (`what` for, in the error if there is none)."""
        if self.compute is None:
            raise RuntimeError(f"no compute adapter to {what}")
        return self.compute


@dataclass(frozen=True)
class Deployment:
    settings: Settings
    registry: Registry
    compute: Compute
    policy: Policy
    notify: Notify
    metrics: Metrics

    def context(self, *, dry_run: bool = False) -> Context:
        return Context(self.registry, self.compute, self.policy, self.metrics, self.notify, dry_run)


def build(settings: Settings, adapters: Adapters, metrics: Metrics) -> Deployment:
    """Fresh per invocation, since the policy may have changed. Every transition to an end is announced on
    the notification topic by the run whose compare-and-swap made it."""
    notify = Notify(adapters.notifier(settings), metrics)
    registry = Registry(adapters.store(settings), settings.root, listeners=[notify.transition],
                        vend_url=settings.vend_url)
    policy = registry.policy()
    return Deployment(settings, registry, adapters.compute(settings, policy), policy, notify, metrics)
