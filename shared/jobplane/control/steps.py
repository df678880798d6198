"""One launch's steps, each applied to the job's record (jobplane.control.launcher runs them in order): the snapshot a
launch decides on, the cloud's request for a decided launch (the VM's script, where its agent comes from, and what
the attempt costs an hour), and the record after the step: the attempt's VMs recorded (with its cluster.json), a
wait for capacity, or the job FAILED.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.clouds.base import Compute, Instance, LaunchRequest, NotFound, SpotPrices, StoreError
from jobplane.decide.rules import LaunchCause
from jobplane.deployment.context import Context
from jobplane.model import keys
from jobplane.model.policy import Policy
from jobplane.model.states import State
from jobplane.store.registry import Registry, TransitionRefused

if TYPE_CHECKING:  # imported where a launch uses them: a cold start, or a cron run with nothing to launch, never does
    from jobplane.boot import agent_bundle, bootstrap
    from jobplane.decide import launch as launch_decide
    from jobplane.model.jobrecord import JobRecord  # the registry builds it when it reads or writes one
    from jobplane.model.usage import AttemptUsage

log = logging.getLogger("jobplane.launcher")

URL_MARGIN_S = 10 * 60  # a VM's agent and report URLs outlive its boot timeout by this much


def next_step(reg: Registry, compute: Compute, snap: launch_decide.LaunchSnapshot, now: datetime,
              scripts: dict[str, str],
              ) -> tuple[launch_decide.Launch, LaunchRequest] | launch_decide.Wait | launch_decide.Fail:
    """The next step, with the cloud's request when it is a launch; or Fail with the error that deciding or
    rendering it raised (a bug, a value out of range): that is pure and would raise again on every resume, leaving
    the job in LAUNCHING with no VM for ever. The store's errors go up: a later check resumes the launch."""
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch

    try:
        step = launch_decide.decide(snap, now)
        if isinstance(step, launch_decide.Launch):
            return step, cloud_request(reg, compute, snap, step, scripts)
        return step
    except StoreError:
        raise
    except Exception as exc:
        log.exception("job %s: its launch could not be decided", snap.record.id, extra={"job_id": snap.record.id})
        return launch_decide.Fail(f"the launch of attempt {snap.record.attempt} could not be decided: "
                                  f"{type(exc).__name__}: {exc}", LaunchCause.LAUNCH_ERROR)


def snapshot(reg: Registry, record: JobRecord, policy: Policy, *, over_quota: str | None = None,
             over_budget: str | None = None) -> launch_decide.LaunchSnapshot:
    """What a launch decides on: the admission's answer (over_quota, over_budget: why it refused) and the agent
    manifest."""
    from jobplane.boot import agent_bundle  # only a launch reads the manifest
    from jobplane.decide import launch as launch_decide  # only a run that launches decides a launch

    try:
        agents = tuple(agent_bundle.parse_manifest(reg.get_bytes(keys.agent_file(agent_bundle.MANIFEST))))
        problem = None
    except (NotFound, ValueError) as exc:
        agents = ()
        problem = (f"{keys.AGENT}{agent_bundle.MANIFEST} "
                   + ("is missing" if isinstance(exc, NotFound) else f"is unreadable ({exc})"))
    return launch_decide.LaunchSnapshot(record, policy, over_quota=over_quota, over_budget=over_budget, agents=agents,
                                        agent_problem=problem)


def cloud_request(reg: Registry, compute: Compute, snap: launch_decide.LaunchSnapshot, step: launch_decide.Launch,
             scripts: dict[str, str]) -> LaunchRequest:
    """The cloud's request for one decided launch; the VM's script is rendered once per architecture."""
    from jobplane.boot import bootstrap  # only a launch renders the VM's script

    record, policy, spec = snap.record, snap.policy, snap.record.spec
    if step.arch not in scripts:
        source = agent_source(reg, list(snap.agents), spec.cloud, step.arch, record.id, record.attempt,
                              expires=policy.boot_timeout(spec) + URL_MARGIN_S)
        if source is None:  # decide launches only architectures the manifest has a bundle for
            raise RuntimeError(f"no {spec.cloud} agent bundle for {step.arch}")
        if reg.bucket is None:
            raise RuntimeError("the registry's store names no bucket: a VM could not reach it")
        scripts[step.arch] = bootstrap.render_for(spec, job_id=record.id, attempt=record.attempt, policy=policy,
                                                  bucket=reg.bucket, root=reg.root, region=compute.region,
                                                  agent=source)
    return LaunchRequest(
        job_id=record.id, attempt=record.attempt, num_nodes=spec.num_nodes, instance_type=step.instance_type,
        zone=step.zone, image=step.image, spot=step.spot, user_data=scripts[step.arch],
        max_runtime=policy.vm_lifetime(spec), disk_gb=spec.disk_gb, owner=record.owner,
        labels=tuple(sorted(spec.labels.items())), accelerator=step.accelerator,
        max_price=spec.max_price if step.spot and spec.cloud == "aws" else None,  # EC2 holds a Spot VM to it
    )


def attempt_usage(compute: Compute, request: LaunchRequest, instances: list[Instance], policy: Policy,
                  now: datetime) -> AttemptUsage:
    """What this attempt runs on and its hourly price (jobplane.views.cost): a Spot launch asks the cloud for the price
    in effect now; a failed lookup never fails the launch, the price is then taken as the policy's, else (EC2) the
    on-demand price, Spot's ceiling, or the max_price the launch bid when lower."""
    from jobplane.model.usage import AttemptUsage, InstanceSpan  # with the record's models, as history
    from jobplane.views import cost  # the price table: only a launch (or an adopted one) prices an attempt

    zone = next((i.zone for i in instances if i.zone), request.zone)
    observed = None
    if request.spot and zone and isinstance(compute, SpotPrices):
        try:
            observed = compute.spot_price(request.instance_type, zone)
        except Exception as exc:
            log.warning("Spot price of %s in %s: %s", request.instance_type, zone, exc,
                        extra={"job_id": request.job_id})
    price, source = cost.hourly_price(compute.cloud, request.instance_type, spot=request.spot, policy=policy,
                                      observed_spot=observed, gpus=request.accelerator)
    if price is not None and source == cost.SPOT_CEILING and request.max_price is not None:
        price = min(price, request.max_price)  # EC2 bills this Spot VM the bid at most
    return AttemptUsage(attempt=request.attempt, instance_type=request.instance_type, zone=zone,
                        market="spot" if request.spot else "on-demand", price=price, price_source=source,
                        instances=[InstanceSpan(id=i.id, start=now) for i in instances])


def agent_source(reg: Registry, variants: list[agent_bundle.Variant], cloud: str, arch: str, job_id: str,
                 attempt: int, *, expires: int) -> bootstrap.AgentSource | None:
    """Where VMs of this architecture fetch the agent (one URL per Python version) and report a failed boot;
    None when the deployment has no bundle for them."""
    from jobplane.boot import agent_bundle, bootstrap  # only a launch fetches the agent

    chosen = agent_bundle.for_vm(variants, cloud, arch)
    if not chosen:
        return None
    bundles = {python: bootstrap.Fetch(v.name, reg.vm_request(keys.agent_file(v.name), write=False,
                                                              expires=expires)[1], v.sha256)
               for python, v in chosen.items()}
    method, url = reg.vm_request(keys.boot_failure(job_id, attempt), write=True, expires=expires)
    return bootstrap.AgentSource(bundles, url, method, reg.vm_auth, vend_url=reg.vend_url)


def launched(ctx: Context, compute: Compute, record: JobRecord, request: LaunchRequest,
              instances: list[tuple[str, str | None, str | None]], now: datetime, errors: list[str],
              usage: AttemptUsage, fallback: str | None = None) -> JobRecord:
    """Record the attempt's VMs; `fallback`: why a Spot job's attempt runs on-demand (in its reason and event)."""
    from jobplane.control import admission  # only a run that launches admits
    from jobplane.model import history, records  # cluster.json: only a run that launched writes one

    reg = ctx.registry
    ids = [i for i, _, _ in instances]
    hosts = [ip or "" for _, ip, _ in instances]
    zone = instances[0][2] or request.zone
    idle = ctx.policy.idle_gpu  # the agents average GPU use over its window and mark idle ranks (jobplane.agent.idle)
    reg.put_json(keys.cluster(record.id, request.attempt), records.ClusterFile(
        job_id=record.id, attempt=request.attempt, hosts=hosts, instances=ids, master_addr=hosts[0],
        master_port=record.spec.master_port, num_nodes=request.num_nodes, instance_type=request.instance_type,
        zone=zone, idle_gpu=records.IdleWatch(window=idle.window, threshold=idle.threshold)
        if idle.action != "off" else None).body())
    ctx.metrics.add_metric("JobsLaunched", "Count", 1)
    log.info("job %s attempt %d: %d x %s in %s", record.id, request.attempt, len(ids), request.instance_type,
             zone, extra={"job_id": record.id})
    try:
        return reg.transition(
            record.id, State.LAUNCHING, now=now, expect={State.LAUNCHING}, expect_attempt=request.attempt,
            cause=LaunchCause.LAUNCHED,
            reason=f"launched {len(ids)} x {request.instance_type} in {zone or 'any zone'}"
                   + (f" ({fallback})" if fallback else ""),
            event=history.Launched(instances=ids, instance_type=request.instance_type, zone=zone, image=request.image,
                                   market=usage.market, price=usage.price, price_source=usage.price_source,
                                   fallback=fallback or None),
            instances=ids, instance_type=request.instance_type, zone=zone, launched_at=now,
            usage=[*(u for u in record.usage if u.attempt != usage.attempt), usage],
            first_launched_at=record.first_launched_at or now, waits=0, wait_until=None, spot_refused_at=None,
            last_error="; ".join(errors) or None,
        )
    except TransitionRefused:
        # cancelled (or moved on) while RunInstances ran: nobody wants these VMs, so they go at once
        log.warning("job %s moved on during launch; terminating %s", record.id, ids, extra={"job_id": record.id})
        compute.terminate(ids)
        admission.release(reg, record)
        return reg.job(record.id)


def wait(reg: Registry, record: JobRecord, step: launch_decide.Wait, now: datetime) -> JobRecord:
    log.info("job %s waits until %s: %s", record.id, step.until, step.reason, extra={"job_id": record.id})
    return reg.transition(record.id, State.WAITING_CAPACITY, now=now, reason=step.reason, cause=step.cause,
                          expect={State.LAUNCHING}, expect_attempt=record.attempt, waits=step.waits,
                          wait_until=step.until, spot_refused_at=step.spot_refused_at, last_error=step.error)


def fail(ctx: Context, record: JobRecord, now: datetime, step: launch_decide.Fail) -> JobRecord:
    reason = step.reason
    ctx.metrics.add_metric("JobsFailed", "Count", 1)
    log.warning("job %s failed: %s", record.id, reason, extra={"job_id": record.id})
    return ctx.registry.transition(record.id, State.FAILED, now=now, reason=reason, cause=step.cause,
                                   expect={State.LAUNCHING}, expect_attempt=record.attempt, last_error=reason)


def named(reg: Registry, record: JobRecord, listed: list[Instance]) -> list[Instance] | None:
    """The VMs the attempt's cluster.json names, when a launcher wrote it and stopped before recording them (a store
    error, a timeout): they are the attempt's, and were told so, so a resume records them, never launches again,
    even if they have ended since (their exit reports, or their absence, then decide the job as any attempt's). As
    listed where the cloud lists them; otherwise as the file says. None: no such file (or not one for this attempt)."""
    from jobplane.model import records  # cluster.json: only a resume reads one

    try:
        written = records.ClusterFile.parse(reg.get_bytes(keys.cluster(record.id, record.attempt)))
    except NotFound:
        return None
    except records.RecordError:
        log.warning("job %s attempt %d: its cluster.json does not parse", record.id, record.attempt,
                    extra={"job_id": record.id})
        return None
    if written.attempt != record.attempt or len(written.instances) != record.spec.num_nodes:
        return None
    by_id = {i.id: i for i in listed}
    spot = next((i.spot for i in listed if i.id in written.instances), bool(record.spec.spot))
    return [by_id.get(iid) or Instance(id=iid, state="terminated", launched_at=record.state_since, managed=True,
                                       job_id=record.id, attempt=record.attempt, rank=rank, spot=spot,
                                       zone=written.zone, instance_type=written.instance_type, private_ip=host)
            for rank, (iid, host) in enumerate(zip(written.instances, written.hosts, strict=False))]
