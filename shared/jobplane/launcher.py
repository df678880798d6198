"""Launcher: queue/ drops become job records, and attempts become VMs (docs/architecture.md).

Idempotency rests on the registry, not on the cloud: job.json is created create-only, and every attempt
is claimed by a CAS transition to LAUNCHING before any VM is asked for, so redelivered events, the cron
backstop and overlapping reruns never launch one attempt twice.

Order for a drop: create the record, launch, then delete the queue entry. If a run dies in between, the
entry is still there and the backstop finishes the job (the record exists, the claim decides who launches).
A cancel that lands after the claim is seen by a re-read before each RunInstances, or by the refused
transition that records the VMs, which then terminates them at once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from jobplane import agent_bundle, bootstrap, cost, drops, images, keys
from jobplane.clouds.base import (
    TAG_OWNER,
    CapacityError,
    Compute,
    Instance,
    LaunchRejected,
    LaunchRequest,
    NotFound,
    SpotPrices,
)
from jobplane.errors import FieldError, SpecError
from jobplane.policy import Policy, check_against_deployment, check_against_policy
from jobplane.registry import JobExists, JobRecord, Registry, TransitionRefused
from jobplane.settings import Settings
from jobplane.spec import JobSpec, format_duration
from jobplane.states import State
from jobplane.telemetry import Metrics
from jobplane.usage import AttemptUsage, InstanceSpan

log = logging.getLogger("jobplane.launcher")

BACKOFF_BASE_S = 60  # first capacity wait; doubles per consecutive failed try
BACKOFF_CAP_S = 30 * 60
URL_MARGIN_S = 10 * 60  # a VM's agent and report URLs outlive its boot timeout by this much
OUTCOMES = {State.LAUNCHING: "launched", State.WAITING_CAPACITY: "waiting", State.FAILED: "failed"}


def candidates(spec: JobSpec) -> list[tuple[str, str | None]]:
    """(instance_type, zone) in the spec's order: every zone of the first type, then the next type."""
    zones: list[str | None] = list(spec.zones) or [None]
    return [(itype, zone) for itype in spec.instance_types for zone in zones]


# ---- drops -----------------------------------------------------------------------------------------------
def handle_drop(reg: Registry, compute: Compute, key: str, *, now: datetime, metrics: Metrics,
                policy: Policy | None = None) -> str:
    """Turn one queue/ object (key relative to the registry root) into a job; return what happened.

    Outcomes: launched | waiting | failed (the launch), rejected (unreadable spec, a bad name, or an owner that
    is not the drop's; see jobplane.drops), invalid (breaks the policy; recorded as an INVALID job), duplicate
    (the id belongs to another job), exists (this drop was handled already), gone (the entry was consumed
    already), ignored (not a queue entry).
    """
    drop = keys.parse_drop(key)
    if drop is None:
        return "ignored"
    job_id = drop.job_id
    try:
        data = reg.get_bytes(key)
    except NotFound:
        return "gone"
    try:
        spec = drops.read_spec(drop, data)
    except SpecError as exc:
        return _reject(reg, key, job_id, data, exc.errors, now, metrics)
    policy = policy or reg.policy()  # handlers pass the one they read; read once here otherwise
    problems = check_against_policy(spec, policy) + check_against_deployment(spec, compute.cloud, compute.region)
    try:
        reg.create_job(job_id, spec, now)
    except JobExists:
        existing = reg.job(job_id)
        if existing.spec != spec:
            return _reject(reg, key, job_id, data, [FieldError("id", f"job {job_id!r} already exists "
                           f"(state {existing.state}); job ids are never reused: pick another id")],
                           now, metrics, outcome="duplicate")
        # the same spec again: a redelivered event (or an identical re-drop); the record decides the rest
    if problems:
        return _invalid(reg, key, job_id, data, problems, now, metrics)
    try:
        record = launch_attempt(reg, compute, job_id, now=now, expect={State.QUEUED}, expect_attempt=0,
                                metrics=metrics, reason="launching attempt 1", policy=policy)
        outcome = OUTCOMES.get(record.state, record.state.lower())
    except TransitionRefused:
        outcome = "exists"  # another delivery of this drop claimed it first
    reg.delete(key)
    return outcome


def _write_rejection(reg: Registry, key: str, job_id: str, data: bytes, errors: list[FieldError],
                     now: datetime) -> None:
    reg.put(keys.rejected_spec(job_id), data, "application/yaml")
    reg.put_json(keys.rejected_error(job_id), {"errors": [e.as_dict() for e in errors], "time": now.isoformat(),
                                               "source_key": key})
    log.warning("rejected %s: %s", key, "; ".join(map(str, errors)), extra={"job_id": job_id})


def _reject(reg: Registry, key: str, job_id: str, data: bytes, errors: list[FieldError], now: datetime,
            metrics: Metrics, outcome: str = "rejected") -> str:
    """Keep the drop and its reasons under rejected/, then consume it. Nothing is launched."""
    _write_rejection(reg, key, job_id, data, errors, now)
    reg.delete(key)
    metrics.add_metric("JobsRejected", "Count", 1)
    return outcome


def _invalid(reg: Registry, key: str, job_id: str, data: bytes, errors: list[FieldError], now: datetime,
             metrics: Metrics) -> str:
    """A well-formed spec the policy refuses: rejected/ as above, and the job recorded as INVALID."""
    _write_rejection(reg, key, job_id, data, errors, now)
    try:
        reg.transition(job_id, State.INVALID, now=now, expect={State.QUEUED}, expect_attempt=0,
                       reason="; ".join(map(str, errors)), event={"errors": [e.as_dict() for e in errors]})
        metrics.add_metric("JobsRejected", "Count", 1)
    except TransitionRefused:
        pass  # another delivery recorded it
    reg.delete(key)
    return "invalid"


# ---- the cron backstop -----------------------------------------------------------------------------------
def backstop(reg: Registry, compute: Compute, *, now: datetime, metrics: Metrics, min_age: int = 60,
             policy: Policy | None = None) -> list[str]:
    """Catch what events missed: queue entries older than min_age s, and capacity waits that are over."""
    policy = policy or reg.policy()
    outcomes: list[str] = []
    for key, modified, _ in list(reg.listing(keys.QUEUE)):
        if now - modified >= timedelta(seconds=min_age):
            outcome = _guarded(key, handle_drop, reg, compute, key, now=now, metrics=metrics, policy=policy)
            outcomes.append(f"{key}: {outcome}")
    for job_id, markers in reg.active().items():
        if [m.state for m in markers] != [State.WAITING_CAPACITY]:
            continue  # not waiting (or markers need a repair, which the sweeper does)
        record = reg.job(job_id)  # a GET only for waiting jobs
        if record.state != State.WAITING_CAPACITY or (record.wait_until and record.wait_until > now):
            continue
        outcomes.append(f"{job_id}: " + _guarded(
            job_id, _retry_waiting, reg, compute, job_id, attempt=record.attempt, now=now, metrics=metrics,
            policy=policy))
    return outcomes


def _retry_waiting(reg: Registry, compute: Compute, job_id: str, *, attempt: int, now: datetime,
                   metrics: Metrics, policy: Policy) -> str:
    try:
        record = launch_attempt(reg, compute, job_id, now=now, expect={State.WAITING_CAPACITY},
                                expect_attempt=attempt, metrics=metrics, reason="capacity wait over: retrying",
                                policy=policy)
    except TransitionRefused:
        return "claimed elsewhere"
    return OUTCOMES.get(record.state, record.state.lower())


def _guarded(job_id: str, fn: Any, *args: Any, **kwargs: Any) -> str:
    """One bad job must not stop the backstop from serving the others."""
    try:
        return str(fn(*args, **kwargs))
    except Exception:
        log.exception("backstop failed on %s", job_id, extra={"job_id": job_id})
        return "error"


# ---- one attempt -----------------------------------------------------------------------------------------
def launch_attempt(
    reg: Registry,
    compute: Compute,
    job_id: str,
    *,
    now: datetime,
    expect: Collection[State],
    expect_attempt: int,
    metrics: Metrics,
    reason: str | None = None,
    policy: Policy | None = None,
) -> JobRecord:
    """Claim the job (CAS to LAUNCHING), then launch it, wait for capacity, or fail it. See the brief's
    contract: the attempt is bumped from QUEUED / PREEMPTED / LAUNCHING, kept from WAITING_CAPACITY."""
    current = reg.job(job_id)
    if current.state not in expect or current.attempt != expect_attempt:
        raise TransitionRefused(job_id, current.state, State.LAUNCHING,
                                f"state {current.state} attempt {current.attempt}, expected "
                                f"{'/'.join(sorted(expect))} attempt {expect_attempt}")
    bump = current.state != State.WAITING_CAPACITY or current.attempt == 0
    attempt = current.attempt + 1 if bump else current.attempt
    restarts = current.restarts + (1 if bump and current.attempt >= 1 else 0)
    record = reg.transition(job_id, State.LAUNCHING, now=now, reason=reason or f"launching attempt {attempt}",
                            expect={current.state}, expect_attempt=current.attempt, attempt=attempt,
                            restarts=restarts, instances=[], instance_type=None, zone=None, launched_at=None)
    policy = policy or reg.policy()
    spec = record.spec
    over = quota_problem(compute, record, policy)
    if over:
        return _wait(reg, record, policy, now, metrics, reason=over, error=over)
    try:
        variants = agent_bundle.parse_manifest(reg.get_bytes(keys.agent_file(agent_bundle.MANIFEST)))
    except (NotFound, ValueError) as exc:
        problem = "is missing" if isinstance(exc, NotFound) else f"is unreadable ({exc})"
        return _fail(reg, record, now, metrics, f"no agent bundle in this deployment: {keys.AGENT}"
                                                f"{agent_bundle.MANIFEST} {problem}; deploy it (cdk deploy, or make "
                                                f"gcp-package and terraform apply)")
    bucket, region = _bootstrap_target(reg, compute)
    scripts: dict[str, str] = {}  # per CPU architecture: each fetches its own agent bundle
    errors: list[str] = []
    for itype, zone in candidates(spec):
        arch = images.architecture(spec.cloud, itype)
        if arch not in scripts:
            source = agent_source(reg, variants, spec.cloud, arch, job_id, attempt,
                                  expires=policy.boot_timeout(spec) + URL_MARGIN_S)
            if source is None:
                return _fail(reg, record, now, metrics, f"instance_type: {itype} is an {arch} type and this "
                                                        f"deployment has no {spec.cloud} agent bundle for {arch}")
            scripts[arch] = bootstrap.render_for(spec, job_id=job_id, attempt=attempt, policy=policy,
                                                 bucket=bucket, root=reg.root, region=region, agent=source)
        request = LaunchRequest(
            job_id=job_id, attempt=attempt, num_nodes=spec.num_nodes, instance_type=itype, zone=zone,
            image=images.resolve(spec.cloud, policy.image(spec, itype), itype), spot=spec.spot,
            user_data=scripts[arch], max_runtime=policy.max_runtime(spec), disk_gb=spec.disk_gb,
            owner=record.owner, labels=tuple(sorted(spec.labels.items())),
        )
        current = reg.job(job_id)  # cancelled since the claim? then no VM is asked for
        if current.state != State.LAUNCHING or current.attempt != attempt:
            log.info("job %s moved on to %s before launch", job_id, current.state, extra={"job_id": job_id})
            return current
        try:
            instances = compute.launch(request)
        except CapacityError as exc:
            errors.append(f"{itype} in {zone or 'any zone'}: {exc}")
            metrics.add_metric("LaunchCapacityErrors", "Count", 1)
            log.info("no capacity for %s in %s: %s", itype, zone or "any zone", exc, extra={"job_id": job_id})
            continue
        except LaunchRejected as exc:
            return _fail(reg, record, now, metrics, f"the cloud refused {itype} in {zone or 'any zone'}: {exc}")
        return _launched(reg, compute, record, request, [(i.id, i.private_ip, i.zone) for i in instances], now,
                         metrics, errors, attempt_usage(compute, request, instances, policy, now), policy)
    return _wait(reg, record, policy, now, metrics, reason="no capacity in any zone or instance type",
                 error="; ".join(errors))


def quota_problem(compute: Compute, record: JobRecord, policy: Policy) -> str | None:
    """Why this attempt would break the owner's instance quota, or None. Counts live managed VMs by tag."""
    limit = policy.max_active_instances_per_owner
    owner_keys = (TAG_OWNER, TAG_OWNER.replace(":", "-"))  # EC2 tag, GCE label
    active = sum(
        1 for inst in compute.list_managed()
        if inst.job_id != record.id and any(dict(inst.tags).get(k) == record.owner for k in owner_keys)
    )
    need = record.spec.num_nodes
    if active + need <= limit:
        return None
    return (f"owner {record.owner!r} has {active} active instances; {need} more would exceed the quota of "
            f"{limit} (max_active_instances_per_owner)")


def attempt_usage(compute: Compute, request: LaunchRequest, instances: list[Instance], policy: Policy,
                  now: datetime) -> AttemptUsage:
    """What this attempt runs on and its hourly price (jobplane.cost): a Spot launch asks the cloud for the price
    in effect now; a failed lookup never fails the launch, the price is then taken as the policy's or unknown."""
    zone = next((i.zone for i in instances if i.zone), request.zone)
    observed = None
    if request.spot and zone and isinstance(compute, SpotPrices):
        try:
            observed = compute.spot_price(request.instance_type, zone)
        except Exception as exc:
            log.warning("Spot price of %s in %s: %s", request.instance_type, zone, exc,
                        extra={"job_id": request.job_id})
    price, source = cost.hourly_price(compute.cloud, request.instance_type, spot=request.spot, policy=policy,
                                      observed_spot=observed)
    return AttemptUsage(attempt=request.attempt, instance_type=request.instance_type, zone=zone,
                        market="spot" if request.spot else "on-demand", price=price, price_source=source,
                        instances=[InstanceSpan(id=i.id, start=now) for i in instances])


def agent_source(reg: Registry, variants: list[agent_bundle.Variant], cloud: str, arch: str, job_id: str,
                 attempt: int, *, expires: int) -> bootstrap.AgentSource | None:
    """Where VMs of this architecture fetch the agent (one URL per Python version) and report a failed boot;
    None when the deployment has no bundle for them."""
    chosen = agent_bundle.for_vm(variants, cloud, arch)
    if not chosen:
        return None
    bundles = {python: bootstrap.Fetch(v.name, reg.vm_request(keys.agent_file(v.name), write=False,
                                                              expires=expires)[1], v.sha256)
               for python, v in chosen.items()}
    method, url = reg.vm_request(keys.boot_failure(job_id, attempt), write=True, expires=expires)
    return bootstrap.AgentSource(bundles, url, method, reg.vm_auth)


def _bootstrap_target(reg: Registry, compute: Compute) -> tuple[str, str | None]:
    """Bucket and region for the VM's script: stores and adapters that know them say so, else the env."""
    bucket = reg.bucket
    region = getattr(compute, "region", None)
    if not isinstance(bucket, str) or not bucket or not isinstance(region, str):
        settings = Settings.from_env()
        bucket = bucket if isinstance(bucket, str) and bucket else settings.bucket
        region = region if isinstance(region, str) else settings.region
    return bucket, region


def _launched(reg: Registry, compute: Compute, record: JobRecord, request: LaunchRequest,
              instances: list[tuple[str, str | None, str | None]], now: datetime, metrics: Metrics,
              errors: list[str], usage: AttemptUsage, policy: Policy) -> JobRecord:
    ids = [i for i, _, _ in instances]
    hosts = [ip or "" for _, ip, _ in instances]
    zone = instances[0][2] or request.zone
    idle = policy.idle_gpu  # the agents average GPU use over its window and mark idle ranks (jobplane.agent.idle)
    reg.put_json(keys.cluster(record.id, request.attempt), {
        "job_id": record.id, "attempt": request.attempt, "hosts": hosts, "instances": ids,
        "master_addr": hosts[0], "master_port": record.spec.master_port, "num_nodes": request.num_nodes,
        "instance_type": request.instance_type, "zone": zone,
        **({"idle_gpu": {"window": idle.window, "threshold": idle.threshold}} if idle.action != "off" else {}),
    })
    metrics.add_metric("JobsLaunched", "Count", 1)
    log.info("job %s attempt %d: %d x %s in %s", record.id, request.attempt, len(ids), request.instance_type,
             zone, extra={"job_id": record.id})
    try:
        return reg.transition(
            record.id, State.LAUNCHING, now=now, expect={State.LAUNCHING}, expect_attempt=request.attempt,
            reason=f"launched {len(ids)} x {request.instance_type} in {zone or 'any zone'}",
            event={"instances": ids, "instance_type": request.instance_type, "zone": zone, "image": request.image,
                   "market": usage.market, "price": usage.price, "price_source": usage.price_source},
            instances=ids, instance_type=request.instance_type, zone=zone, launched_at=now,
            usage=[*(u for u in record.usage if u.attempt != usage.attempt), usage],
            first_launched_at=record.first_launched_at or now, waits=0, wait_until=None,
            last_error="; ".join(errors) or None,
        )
    except TransitionRefused:
        # cancelled (or moved on) while RunInstances ran: nobody wants these VMs, so they go at once
        log.warning("job %s moved on during launch; terminating %s", record.id, ids, extra={"job_id": record.id})
        compute.terminate(ids)
        return reg.job(record.id)


def _wait(reg: Registry, record: JobRecord, policy: Policy, now: datetime, metrics: Metrics, *, reason: str,
          error: str) -> JobRecord:
    """Back off exponentially, or fail once max_wait (counted from submission) is spent."""
    max_wait = policy.max_wait(record.spec)
    deadline = record.created_at + timedelta(seconds=max_wait)
    if now >= deadline:
        return _fail(reg, record, now, metrics, f"{reason} within max_wait {format_duration(max_wait)}: {error}")
    waits = record.waits + 1
    delay = timedelta(seconds=min(BACKOFF_BASE_S * 2 ** (waits - 1), BACKOFF_CAP_S))
    log.info("job %s waits until %s: %s", record.id, min(now + delay, deadline), reason, extra={"job_id": record.id})
    return reg.transition(record.id, State.WAITING_CAPACITY, now=now, reason=reason, expect={State.LAUNCHING},
                          expect_attempt=record.attempt, waits=waits, wait_until=min(now + delay, deadline),
                          last_error=error)


def _fail(reg: Registry, record: JobRecord, now: datetime, metrics: Metrics, reason: str) -> JobRecord:
    metrics.add_metric("JobsFailed", "Count", 1)
    log.warning("job %s failed: %s", record.id, reason, extra={"job_id": record.id})
    return reg.transition(record.id, State.FAILED, now=now, reason=reason, expect={State.LAUNCHING},
                          expect_attempt=record.attempt, last_error=reason)
