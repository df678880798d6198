"""The launcher's decisions: which attempt a claim makes, then one step at a time what to do with it.

`claim` says whether a job may be claimed as the caller saw it, and with which attempt and restart count:
the attempt is bumped from QUEUED, PREEMPTED and LAUNCHING (a boot retry), and kept from WAITING_CAPACITY
(the wait was part of the same attempt). `decide` then takes what the launcher has read and what the
cloud has answered so far, and gives the next step: launch the next (instance type, zone) candidate with
its image, wait for capacity or quota with exponential backoff, or fail (max_wait spent, no agent bundle
for the type's architecture, the cloud refused the request itself). The launcher applies each step and
feeds the cloud's answer back (LaunchSnapshot.after): a capacity error falls through to the next
candidate, and when none is left the attempt waits (or fails once max_wait is spent).

A Spot job tries Spot in every candidate first. With `spot: {fallback: on_demand, after: D}`, once Spot has
been refused everywhere for D, counted from the attempt's first such refusal (JobRecord.spot_refused_at,
cleared when an attempt launches), the same candidates are tried on-demand; the wait before then ends at
exactly D, so the fallback is neither early nor late by a backoff step. Each attempt starts with Spot again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from jobplane.boot import agent_bundle
from jobplane.decide.rules import LaunchCause
from jobplane.model import accelerators, images
from jobplane.model.bounds import format_duration
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import Policy
from jobplane.model.spec import JobSpec
from jobplane.model.states import State

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
    retries: int = 0


@dataclass(frozen=True)
class Refused:
    why: str  # the job is not as the caller saw it: another run claimed it, or it moved on


def claim(record: JobRecord, *, expect: Collection[State], expect_attempt: int,
          reason: str | None = None, retry: bool = False) -> Claim | Refused:
    """`retry`: the new attempt retries an error (the spec's retry:), counted in retries, not restarts."""
    if record.state not in expect or record.attempt != expect_attempt:
        return Refused(f"state {record.state} attempt {record.attempt}, expected {'/'.join(sorted(expect))} "
                       f"attempt {expect_attempt}")
    bump = record.state != State.WAITING_CAPACITY or record.attempt == 0
    attempt = record.attempt + 1 if bump else record.attempt
    rerun = bump and record.attempt >= 1
    restarts = record.restarts + (1 if rerun and not retry else 0)
    retries = record.retries + (1 if rerun and retry else 0)
    return Claim(attempt, restarts, reason or f"launching attempt {attempt}", retries)


# ---- the steps ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tried:
    """What the cloud answered one candidate: no capacity (the next one is tried), or a refusal of the
    request itself (rejected: a bad image, a quota of the account; no other candidate would fare better)."""

    instance_type: str
    zone: str | None
    error: str
    rejected: bool = False
    spot: bool = False

    @property
    def where(self) -> str:
        return f"{self.instance_type}{' Spot' if self.spot else ''} in {self.zone or 'any zone'}"


@dataclass(frozen=True)
class LaunchSnapshot:
    """What one launch decides on. `record` is the claimed job (LAUNCHING, its attempt)."""

    record: JobRecord
    policy: Policy
    over_quota: str | None = None  # why the admission refused the attempt (jobplane.decide.admission), if it did
    over_budget: str | None = None  # why its owner's budget stops it (jobplane.decide.budget), if it does
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
    spot: bool = False
    accelerator: tuple[str, int] | None = None  # GCE guestAccelerators (type, count): N1 types only
    fallback: str | None = None  # why a Spot job's attempt launches on-demand


@dataclass(frozen=True)
class Wait:
    reason: str
    error: str
    waits: int  # consecutive waits of this attempt, this one included
    until: datetime  # the backstop retries from then on
    spot_refused_at: datetime | None = None  # the attempt's first refusal of Spot everywhere, if any
    cause: LaunchCause = field(kw_only=True)  # NO_CAPACITY, OVER_QUOTA or OVER_BUDGET


@dataclass(frozen=True)
class Fail:
    reason: str
    cause: LaunchCause


Step = Launch | Wait | Fail


def decide(snap: LaunchSnapshot, now: datetime) -> Step:
    record, policy = snap.record, snap.policy
    spec = record.spec
    over = snap.over_quota
    if over:
        return backoff(record, policy, now, reason=over, error=over, cause=LaunchCause.OVER_QUOTA)
    if spent := snap.over_budget:  # a new job of an owner at its budget: refused, or it waits for the next month
        if policy.budgets.on_exceeded_for(record.owner) == "refuse":
            return Fail(f"refused: {spent}", LaunchCause.OVER_BUDGET)
        return backoff(record, policy, now, reason=spent, error=spent, cause=LaunchCause.OVER_BUDGET)
    if snap.agent_problem is not None:
        return Fail(f"no agent bundle in this deployment: {snap.agent_problem}; {DEPLOY_AGENT}", LaunchCause.NO_AGENT)
    rejected = next((t for t in snap.tried if t.rejected), None)
    if rejected is not None:
        return Fail(f"the cloud refused {rejected.where}: {rejected.error}", LaunchCause.REJECTED)
    tried = {(t.instance_type, t.zone, t.spot) for t in snap.tried}
    refused_at, fallback_at = spot_fallback(snap, now)
    markets = [spec.uses_spot] + ([False] if fallback_at is not None and now >= fallback_at else [])
    gpu, after = spec.accelerators, spec.spot_fallback_after
    for spot in markets:
        for itype, zone in candidates(spec):
            if (itype, zone, spot) in tried:
                continue
            arch = images.architecture(spec.cloud, itype)
            if not agent_bundle.for_vm(snap.agents, spec.cloud, arch):
                return Fail(f"instance_type: {itype} is an {arch} type and this deployment has no {spec.cloud} "
                            f"agent bundle for {arch}", LaunchCause.NO_AGENT)
            attach = accelerators.guest_accelerator(spec.cloud, gpu.model, gpu.count, itype) if gpu else None
            why = (f"on-demand: Spot refused in every zone and type for {format_duration(after)}"
                   if spec.uses_spot and not spot and after else None)
            return Launch(itype, zone, images.resolve(spec.cloud, policy.image(spec, itype), itype), arch, spot=spot,
                          accelerator=attach, fallback=why)
    wait = backoff(record, policy, now, reason="no capacity in any zone or instance type",
                   error="; ".join(f"{t.where}: {t.error}" for t in snap.tried), cause=LaunchCause.NO_CAPACITY)
    if isinstance(wait, Wait) and refused_at is not None:
        # the backstop comes back exactly when the fallback is due, not a backoff step later
        until = min(wait.until, fallback_at) if fallback_at is not None and fallback_at > now else wait.until
        return replace(wait, until=until, spot_refused_at=refused_at)
    return wait


def spot_fallback(snap: LaunchSnapshot, now: datetime) -> tuple[datetime | None, datetime | None]:
    """(since when this attempt's Spot requests have been refused everywhere, when it falls back to
    on-demand): (None, None) while Spot has not been refused in every candidate yet; the second is None
    when the spec has no fallback."""
    spec = snap.record.spec
    refused_at = snap.record.spot_refused_at
    if refused_at is None and spec.uses_spot:
        spot_tried = {(t.instance_type, t.zone) for t in snap.tried if t.spot}
        refused_at = now if set(candidates(spec)) <= spot_tried else None
    after = spec.spot_fallback_after
    if refused_at is None or after is None:
        return refused_at, None
    return refused_at, refused_at + timedelta(seconds=after)


def backoff(record: JobRecord, policy: Policy, now: datetime, *, reason: str, error: str,
            cause: LaunchCause) -> Wait | Fail:
    """Wait exponentially longer per consecutive try, or fail once max_wait (counted from submission) is spent."""
    max_wait = policy.max_wait(record.spec)
    deadline = record.created_at + timedelta(seconds=max_wait)
    if now >= deadline:
        return Fail(f"{reason} within max_wait {format_duration(max_wait)}: {error}", LaunchCause.MAX_WAIT)
    waits = record.waits + 1
    delay = timedelta(seconds=min(BACKOFF_BASE_S * 2 ** (waits - 1), BACKOFF_CAP_S))
    return Wait(reason, error, waits, min(now + delay, deadline), record.spot_refused_at, cause=cause)
