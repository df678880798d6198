"""The launcher's decisions: which attempt a claim makes, then one step at a time what to do with it.

`claim` says whether a job may be claimed as the caller saw it, and with which attempt and restart count:
the attempt is bumped from QUEUED, PREEMPTED and LAUNCHING (a boot retry), and kept from WAITING_CAPACITY
(the wait was part of the same attempt). `decide` then takes what the launcher has read and what the
cloud has answered so far, and gives the next step: launch the next (instance type, zone) candidate with
its image, wait for capacity or quota with exponential backoff, or fail (max_wait spent, no agent bundle
for the type's architecture, the cloud refused the request itself). The launcher applies each step and
feeds the cloud's answer back (LaunchSnapshot.after): a capacity error falls through to the next
candidate, and when none is left the attempt waits (or fails once max_wait is spent).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from jobplane import agent_bundle, images
from jobplane.policy import Policy
from jobplane.registry import JobRecord
from jobplane.spec import JobSpec, format_duration
from jobplane.states import State

BACKOFF_BASE_S = 60  # first capacity wait; doubles per consecutive failed try
BACKOFF_CAP_S = 30 * 60
DEPLOY_AGENT = "deploy it (cdk deploy, or make gcp-package and terraform apply)"


def candidates(spec: JobSpec) -> list[tuple[str, str | None]]:
    """(instance_type, zone) in the spec's order: every zone of the first type, then the next type."""
    zones: list[str | None] = list(spec.zones) or [None]
    return [(itype, zone) for itype in spec.instance_types for zone in zones]


# ---- the claim ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    attempt: int
    restarts: int
    reason: str


@dataclass(frozen=True)
class Refused:
    why: str  # the job is not as the caller saw it: another run claimed it, or it moved on


def claim(record: JobRecord, *, expect: Collection[State], expect_attempt: int,
          reason: str | None = None) -> Claim | Refused:
    if record.state not in expect or record.attempt != expect_attempt:
        return Refused(f"state {record.state} attempt {record.attempt}, expected {'/'.join(sorted(expect))} "
                       f"attempt {expect_attempt}")
    bump = record.state != State.WAITING_CAPACITY or record.attempt == 0
    attempt = record.attempt + 1 if bump else record.attempt
    restarts = record.restarts + (1 if bump and record.attempt >= 1 else 0)
    return Claim(attempt, restarts, reason or f"launching attempt {attempt}")


# ---- the steps ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tried:
    """What the cloud answered one candidate: no capacity (the next one is tried), or a refusal of the
    request itself (rejected: a bad image, a quota of the account; no other candidate would fare better)."""

    instance_type: str
    zone: str | None
    error: str
    rejected: bool = False

    @property
    def where(self) -> str:
        return f"{self.instance_type} in {self.zone or 'any zone'}"


@dataclass(frozen=True)
class LaunchSnapshot:
    """What one launch decides on. `record` is the claimed job (LAUNCHING, its attempt)."""

    record: JobRecord
    policy: Policy
    owner_active: int = 0  # the owner's live managed VMs of other jobs: the quota's usage
    agents: tuple[agent_bundle.Variant, ...] = ()  # the deployment's agent bundles (its manifest)
    agent_problem: str | None = None  # why the manifest could not be read ("is missing", "is unreadable (...)")
    tried: tuple[Tried, ...] = ()  # the cloud's answers so far, in order

    def after(self, tried: Tried) -> LaunchSnapshot:
        return replace(self, tried=(*self.tried, tried))


@dataclass(frozen=True)
class Launch:
    instance_type: str
    zone: str | None
    image: str  # what the cloud's launch call takes (an alias resolved for the type's architecture)
    arch: str  # which agent bundle the VMs fetch


@dataclass(frozen=True)
class Wait:
    reason: str
    error: str
    waits: int  # consecutive waits of this attempt, this one included
    until: datetime  # the backstop retries from then on


@dataclass(frozen=True)
class Fail:
    reason: str


Step = Launch | Wait | Fail


def decide(snap: LaunchSnapshot, now: datetime) -> Step:
    record, policy = snap.record, snap.policy
    spec = record.spec
    over = quota_problem(record, policy, snap.owner_active)
    if over:
        return backoff(record, policy, now, reason=over, error=over)
    if snap.agent_problem is not None:
        return Fail(f"no agent bundle in this deployment: {snap.agent_problem}; {DEPLOY_AGENT}")
    rejected = next((t for t in snap.tried if t.rejected), None)
    if rejected is not None:
        return Fail(f"the cloud refused {rejected.where}: {rejected.error}")
    tried = {(t.instance_type, t.zone) for t in snap.tried}
    for itype, zone in candidates(spec):
        if (itype, zone) in tried:
            continue
        arch = images.architecture(spec.cloud, itype)
        if not agent_bundle.for_vm(snap.agents, spec.cloud, arch):
            return Fail(f"instance_type: {itype} is an {arch} type and this deployment has no {spec.cloud} agent "
                        f"bundle for {arch}")
        return Launch(itype, zone, images.resolve(spec.cloud, policy.image(spec, itype), itype), arch)
    return backoff(record, policy, now, reason="no capacity in any zone or instance type",
                   error="; ".join(f"{t.where}: {t.error}" for t in snap.tried))


def quota_problem(record: JobRecord, policy: Policy, owner_active: int) -> str | None:
    """Why this attempt would break the owner's instance quota, or None."""
    limit, need = policy.max_active_instances_per_owner, record.spec.num_nodes
    if owner_active + need <= limit:
        return None
    return (f"owner {record.owner!r} has {owner_active} active instances; {need} more would exceed the quota of "
            f"{limit} (max_active_instances_per_owner)")


def backoff(record: JobRecord, policy: Policy, now: datetime, *, reason: str, error: str) -> Wait | Fail:
    """Wait exponentially longer per consecutive try, or fail once max_wait (counted from submission) is spent."""
    max_wait = policy.max_wait(record.spec)
    deadline = record.created_at + timedelta(seconds=max_wait)
    if now >= deadline:
        return Fail(f"{reason} within max_wait {format_duration(max_wait)}: {error}")
    waits = record.waits + 1
    delay = timedelta(seconds=min(BACKOFF_BASE_S * 2 ** (waits - 1), BACKOFF_CAP_S))
    return Wait(reason, error, waits, min(now + delay, deadline))
