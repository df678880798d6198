"""Compute over Compute Engine (google-cloud-compute, imported in the constructor: it costs ~1 s).

One launch is one API call: insert for a single VM in a given zone, bulkInsert with count = minCount =
num_nodes (all or nothing) otherwise; with no zone, a regional bulkInsert whose location policy
ANY_SINGLE_ZONE lets GCE pick a zone with room. Every VM carries the ownership labels (also as metadata
attributes, since the metadata server does not expose labels), Spot via provisioningModel SPOT, and the
uptime cap natively as scheduling.maxRunDuration with instanceTerminationAction DELETE, and GPUs asked for on
an N1 type as guestAccelerators (onHostMaintenance is TERMINATE on every VM, which GPUs require). requestId is a
UUID derived from job, attempt, location and the minute, so a duplicated launch returns the first call's
operation (see request_id).

An instance id is "zone/name": names are unique per zone only, and delete needs the zone.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import re
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobplane.clouds.base import (
    TAG_ATTEMPT,
    TAG_DEPLOYMENT,
    TAG_JOB_ID,
    TAG_MANAGED,
    TAG_OWNER,
    TAG_RANK,
    CapacityError,
    Instance,
    LaunchRejected,
    LaunchRequest,
)
from jobplane.clouds.gce_metadata import gce_key
from jobplane.model.policy import GcpPlacement
from jobplane.settings import Settings

log = logging.getLogger("jobplane.gcp")

# Errors that say "no room here now": the launcher tries the next zone / type, then waits with backoff.
# QUOTA_EXCEEDED is counted in: a regional CPU/GPU quota frees up as other jobs' VMs end, and another
# instance type may draw on a different quota, so waiting (bounded by max_wait) beats failing the job.
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED",
})
# A GPU type the zone does not offer (or this project cannot see) is answered "The resource
# 'projects/P/zones/Z/acceleratorTypes/T' was not found": another zone or type may have it, like capacity.
ACCELERATOR_UNAVAILABLE = "ACCELERATOR_UNAVAILABLE"
_NO_ACCELERATOR = re.compile(r"/acceleratorTypes/[^'\s]+' was not found")
_RETRYABLE_HTTP = {429, 503}  # rate limited / backend unavailable before an operation even exists
LABEL_MANAGED, LABEL_JOB_ID, LABEL_ATTEMPT = gce_key(TAG_MANAGED), gce_key(TAG_JOB_ID), gce_key(TAG_ATTEMPT)
LABEL_RANK, LABEL_OWNER, LABEL_DEPLOYMENT = gce_key(TAG_RANK), gce_key(TAG_OWNER), gce_key(TAG_DEPLOYMENT)
_TAG_OF_LABEL = {gce_key(t): t for t in (TAG_MANAGED, TAG_JOB_ID, TAG_ATTEMPT, TAG_RANK, TAG_OWNER, TAG_DEPLOYMENT)}
MANAGED_FILTER = f'labels.{LABEL_MANAGED} = "true"'
PREEMPTED_OPERATION = "compute.instances.preempted"
VM_NAME_PREFIX = "jobplane-"  # infra/gcp grants delete / setMetadata only on VMs named so
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
REQUEST_WINDOW_S = 60
_REQUEST_NAMESPACE = uuid.UUID("6f1d1b5e-7a4c-4f0e-9d55-0b6a3c9e2f10")  # fixed: request ids must be stable
_STATES = {
    "PROVISIONING": "pending", "STAGING": "pending", "REPAIRING": "pending", "RUNNING": "running",
    "STOPPING": "stopping", "SUSPENDING": "stopping", "PENDING_STOP": "stopping",
    "TERMINATED": "stopped", "SUSPENDED": "stopped",
}

AGENT_MATCH = "python[0-9.]* -m jobplane[.]agent"  # pgrep -f: python3, python3.11 or a venv's python
SHUTDOWN_WAIT_S = 100


def shutdown_script(agent_match: str = AGENT_MATCH, wait_s: int = SHUTDOWN_WAIT_S) -> str:
    """What GCE runs on any stop or delete (preemption, maxRunDuration, a check's delete): SIGTERM asks the
    agent to stop the job with its grace, sync the newest checkpoint and write the exit report; the script
    waits for the agent to exit, at most wait_s. GCE hard-stops a Spot VM 30 s after the soft off (the
    agent plans for that) and a Standard VM after 120 s, where the longer wait lets a big upload finish."""
    return f"""#!/bin/bash
# jobplane: let the agent stop the job, sync and report before the VM goes away.
pid=$(pgrep -o -f -- {shlex.quote(agent_match)}) || exit 0
kill -TERM "$pid" 2>/dev/null || exit 0
for _ in $(seq {2 * wait_s}); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done
echo "jobplane: the agent (pid $pid) was still running after {wait_s} s" >&2
"""


SHUTDOWN_SCRIPT = shutdown_script()


@dataclass(frozen=True)
class Preemption:
    instance_id: str
    at: datetime


def deployment_prefix(deployment: str | None) -> str:
    """jobplane-<6 hex of sha256(bucket[/root])>-: the start of every VM name of one deployment, which its
    functions' IAM condition allows them to delete or change (infra/gcp computes the same); without a
    deployment (tests), VM_NAME_PREFIX."""
    if not deployment:
        return VM_NAME_PREFIX
    return f"{VM_NAME_PREFIX}{hashlib.sha256(deployment.encode()).hexdigest()[:6]}-"


def deployment_label(deployment: str) -> str:
    """bucket[/root] as a label value (lowercase letters, digits, - and _, at most 63)."""
    value = re.sub(r"[^a-z0-9_-]", "-", deployment.lower())
    return value if len(value) <= 63 else value[:56] + "-" + hashlib.sha256(deployment.encode()).hexdigest()[:6]


def name_prefix(job_id: str, attempt: int, deployment: str | None = None) -> str:
    """VM names are jobplane-[<deployment hash>-]<job>-a<attempt>-0001.. in rank order, room left for the
    number (63 max). Names are fixed per attempt, so two deployments running one job id never collide."""
    start, suffix = deployment_prefix(deployment), f"-a{attempt}"
    room = 63 - len(start) - len("-0001") - len(suffix)
    if len(job_id) <= room:
        return start + job_id + suffix
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:6]
    return start + job_id[: room - 7] + "-" + digest + suffix


def request_id(job_id: str, attempt: int, location: str, at: float) -> str:
    """Same job, attempt, location and minute -> same id, so duplicate deliveries of one launch share one
    operation. GCE answers a known id with its first operation even when that one failed, and a capacity
    wait retries the same attempt at least BACKOFF_BASE_S (60 s) later: the minute gives that retry a fresh
    id. A duplicate straddling a minute boundary still cannot double-launch: VM names are fixed per
    attempt, so its create is a 409 and the VMs already there are adopted."""
    return str(uuid.uuid5(_REQUEST_NAMESPACE, f"{job_id}/{attempt}/{location}/{int(at // REQUEST_WINDOW_S)}"))


def _time(text: str) -> datetime:
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return ts.astimezone(UTC) if ts.tzinfo else ts.replace(tzinfo=UTC)


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def ownership_tags(labels: Mapping[str, str]) -> dict[str, str]:
    """A VM's ownership labels under their tag keys (jobplane-job-id -> jobplane:job-id); other labels dropped."""
    return {_TAG_OF_LABEL[k]: v for k, v in labels.items() if k in _TAG_OF_LABEL}


def _rank(name: str, labels: dict[str, str]) -> int | None:
    if labels.get(LABEL_RANK, "").isdigit():
        return int(labels[LABEL_RANK])
    suffix = name.rsplit("-", 1)[-1]
    return int(suffix) - 1 if len(suffix) == 4 and suffix.isdigit() else None


def to_instance(vm: Any) -> Instance:
    """A compute_v1.Instance as the reconcilers see it."""
    labels = dict(vm.labels)
    zone = _last(vm.zone)
    attempt = labels.get(LABEL_ATTEMPT, "")
    nics = list(vm.network_interfaces)
    return Instance(
        id=f"{zone}/{vm.name}",
        state=_STATES.get(vm.status, "pending"),
        launched_at=_time(vm.creation_timestamp),
        managed=labels.get(LABEL_MANAGED) == "true",
        job_id=labels.get(LABEL_JOB_ID),
        attempt=int(attempt) if attempt.isdigit() else None,
        rank=_rank(vm.name, labels) if LABEL_JOB_ID in labels else None,
        spot=vm.scheduling.provisioning_model == "SPOT",
        protected=bool(vm.deletion_protection),
        zone=zone,
        instance_type=_last(vm.machine_type),
        private_ip=(nics[0].network_i_p or None) if nics else None,
        tags=tuple(sorted(labels.items())),
    )


@functools.cache
def _clients(endpoint: str | None, token: str | None = None) -> tuple[Any, Any, Any, Any, Any]:
    """The Compute Engine clients (instances, region instances, zone, region and global operations), made once
    per process, endpoint and token: a warm function's every run (the check's every minute) would build five again.
    token: an access token the calls carry instead of Application Default Credentials (or an endpoint's none)."""
    # By name, not `from google.cloud import compute_v1`: that typed package would make mypy resolve
    # the google.cloud namespace and then miss the untyped google.cloud.storage that gcs.py imports.
    compute_v1: Any = importlib.import_module("google.cloud.compute_v1")
    kwargs: dict[str, Any] = {"transport": "rest"}
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        kwargs.update(client_options={"api_endpoint": endpoint}, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    if token:
        from jobplane.clouds.gcs import access_token_credentials

        kwargs["credentials"] = access_token_credentials(token)
    return (compute_v1.InstancesClient(**kwargs), compute_v1.RegionInstancesClient(**kwargs),
            compute_v1.ZoneOperationsClient(**kwargs), compute_v1.RegionOperationsClient(**kwargs),
            compute_v1.GlobalOperationsClient(**kwargs))


class GceCompute:
    """The Compute protocol on Compute Engine for one project and region.

    endpoint (JOBPLANE_COMPUTE_ENDPOINT in Settings) points the REST transport at a local fake with anonymous
    credentials, as STORAGE_EMULATOR_HOST does for GCS.
    """

    cloud = "gcp"

    def __init__(
        self,
        project: str,
        region: str,
        *,
        placement: GcpPlacement | None = None,
        endpoint: str | None = None,
        operation_timeout: float = 300.0,
        clock: Callable[[], float] = time.time,
        deployment: str | None = None,
        token: str | None = None,
    ) -> None:
        from google.api_core import exceptions

        self.project, self.region = project, region
        self.deployment = deployment  # None: every managed VM in the project is this deployment's (tests only)
        self._mine = f' AND labels.{LABEL_DEPLOYMENT} = "{deployment_label(deployment)}"' if deployment else ""
        self.placement = placement or GcpPlacement()
        self.operation_timeout = operation_timeout
        self.clock = clock
        self._v1: Any = importlib.import_module("google.cloud.compute_v1")  # by name: see _clients
        self._errors: Any = exceptions
        clients = _clients(endpoint, token)
        self._instances, self._region_instances, self._zone_ops, self._region_ops, self._global_ops = clients

    @classmethod
    def from_settings(cls, settings: Settings, placement: GcpPlacement) -> GceCompute:
        """The deployment's: the policy's gcp.project, else the settings' (GOOGLE_CLOUD_PROJECT), in its region."""
        project = placement.project or settings.project
        if not project or not settings.region:
            raise ValueError("on GCP set GOOGLE_CLOUD_PROJECT (or the policy's gcp.project) and JOBPLANE_REGION")
        return cls(project, settings.region, placement=placement, endpoint=settings.compute_endpoint,
                   deployment=settings.deployment, token=settings.compute_token)

    # ---- launch ------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Instance]:
        prefix = name_prefix(request.job_id, request.attempt, self.deployment)
        location = request.zone or self.region
        rid = request_id(request.job_id, request.attempt, location, self.clock())
        try:
            if request.zone and request.num_nodes == 1:
                op = self._instances.insert_unary(self._v1.InsertInstanceRequest(
                    project=self.project, zone=request.zone, request_id=rid,
                    instance_resource=self._instance(request, f"{prefix}-0001")))
            elif request.zone:
                op = self._instances.bulk_insert_unary(self._v1.BulkInsertInstanceRequest(
                    project=self.project, zone=request.zone, request_id=rid,
                    bulk_insert_instance_resource_resource=self._bulk(request, prefix)))
            else:
                op = self._region_instances.bulk_insert_unary(self._v1.BulkInsertRegionInstanceRequest(
                    project=self.project, region=self.region, request_id=rid,
                    bulk_insert_instance_resource_resource=self._bulk(request, prefix)))
        except self._errors.Conflict:
            log.info("launch of %s attempt %d already done", request.job_id, request.attempt,
                     extra={"job_id": request.job_id})  # an earlier call created the VMs: adopt them
        except self._errors.GoogleAPICallError as err:
            raise self._call_error(err) from err
        else:
            self._wait(op)
        for pause in (0.0, 1.0, 2.0, 4.0):  # a listing may briefly trail a finished insert
            time.sleep(pause)
            instances = self.attempt_instances(request.job_id, request.attempt)
            if len(instances) == request.num_nodes:
                return instances
        raise LaunchRejected("INCOMPLETE_LAUNCH", f"expected {request.num_nodes} VMs for {prefix}, "
                                                  f"found {len(instances)}")

    def _common(self, request: LaunchRequest, disk_type: str, rank: int | None,
                accelerator_type: str = "{}") -> dict[str, Any]:
        """Fields an Instance and bulkInsert's InstanceProperties share. accelerator_type formats the GPU's
        name: zones/<zone>/acceleratorTypes/{} for an insert; bulkInsert's properties, like a template, take
        the bare name."""
        v1, placement = self._v1, self.placement
        ownership = {LABEL_MANAGED: "true", LABEL_JOB_ID: request.job_id, LABEL_ATTEMPT: str(request.attempt),
                     LABEL_OWNER: request.owner}
        if rank is not None:
            ownership[LABEL_RANK] = str(rank)
        if self.deployment:
            ownership[LABEL_DEPLOYMENT] = deployment_label(self.deployment)
        labels = {**dict(request.labels), **ownership}  # the spec's labels never override ownership
        items = [v1.Items(key=k, value=v) for k, v in sorted(ownership.items())]
        items += [v1.Items(key="startup-script", value=request.user_data),
                  v1.Items(key="shutdown-script", value=SHUTDOWN_SCRIPT)]
        nic = v1.NetworkInterface(network=placement.network or "global/networks/default")
        if placement.subnetwork:
            nic.subnetwork = placement.subnetwork
        gpus = [v1.AcceleratorConfig(accelerator_type=accelerator_type.format(request.accelerator[0]),
                                     accelerator_count=request.accelerator[1])] if request.accelerator else []
        return {
            "labels": labels,
            "metadata": v1.Metadata(items=items),
            "guest_accelerators": gpus,
            "disks": [v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=v1.AttachedDiskInitializeParams(
                source_image=request.image, disk_size_gb=request.disk_gb, disk_type=disk_type, labels=labels))],
            "network_interfaces": [nic],  # no external IP: the subnet's NAT / Private Google Access serve it
            "service_accounts": [v1.ServiceAccount(email=placement.service_account or "default", scopes=SCOPES)],
            "scheduling": v1.Scheduling(
                provisioning_model="SPOT" if request.spot else "STANDARD",
                instance_termination_action="DELETE",
                max_run_duration=v1.Duration(seconds=request.max_runtime),
                # A host event must end the attempt visibly (the check reruns it), not reboot it silently;
                # GPUs and Spot cannot live-migrate anyway (GCE refuses MIGRATE with guestAccelerators).
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            ),
        }

    def _instance(self, request: LaunchRequest, name: str) -> Any:
        zone = request.zone
        return self._v1.Instance(
            name=name, machine_type=f"zones/{zone}/machineTypes/{request.instance_type}",
            **self._common(request, f"zones/{zone}/diskTypes/pd-balanced", rank=0,
                           accelerator_type=f"zones/{zone}/acceleratorTypes/{{}}"))

    def _bulk(self, request: LaunchRequest, prefix: str) -> Any:
        v1 = self._v1
        resource = v1.BulkInsertInstanceResource(
            count=request.num_nodes, min_count=request.num_nodes, name_pattern=f"{prefix}-####",
            instance_properties=v1.InstanceProperties(
                machine_type=request.instance_type, **self._common(request, "pd-balanced", rank=None)))
        if not request.zone:
            resource.location_policy = v1.LocationPolicy(target_shape="ANY_SINGLE_ZONE")
        return resource

    def _wait(self, op: Any) -> None:
        """Poll the operation with our own operations client (the unary calls return it unfinished)."""
        deadline = time.monotonic() + self.operation_timeout
        while op.status != self._v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise LaunchRejected("OPERATION_TIMEOUT", f"{op.name} not done after {self.operation_timeout}s")
            if op.zone:
                op = self._zone_ops.wait(project=self.project, zone=_last(op.zone), operation=op.name)
            else:
                op = self._region_ops.wait(project=self.project, region=_last(op.region), operation=op.name)
        errors = list(op.error.errors) if op.error else []
        if errors:
            raise self._classify(errors[0].code, "; ".join(e.message for e in errors))

    @staticmethod
    def _classify(code: str, message: str) -> CapacityError | LaunchRejected:
        if code in CAPACITY_CODES:
            return CapacityError(code, message)
        if _NO_ACCELERATOR.search(message):
            return CapacityError(ACCELERATOR_UNAVAILABLE, message)
        return LaunchRejected(code or "UNKNOWN", message)

    def _call_error(self, err: Any) -> CapacityError | LaunchRejected:
        """An error answered before any operation existed (bad request, quota, rate limit)."""
        details = [e for e in (getattr(err, "errors", None) or []) if isinstance(e, dict)]
        reason = str(getattr(err, "reason", "") or (details[0].get("reason", "") if details else ""))
        if err.code in _RETRYABLE_HTTP or reason in ("quotaExceeded", "rateLimitExceeded"):
            return CapacityError(reason or f"HTTP_{err.code}", str(err.message))
        if _NO_ACCELERATOR.search(str(err.message)):
            return CapacityError(ACCELERATOR_UNAVAILABLE, str(err.message))
        return LaunchRejected(reason or f"HTTP_{err.code}", str(err.message))

    # ---- listing -----------------------------------------------------------------------------------
    def _list(self, expression: str) -> list[Instance]:
        pages = self._instances.aggregated_list(self._v1.AggregatedListInstancesRequest(
            project=self.project, filter=expression, max_results=500))
        return [to_instance(vm) for _, scoped in pages for vm in scoped.instances]

    def list_managed(self) -> list[Instance]:
        """One paginated aggregated list over all zones, filtered server-side by the managed label and this
        deployment's: a VM of another deployment is never listed."""
        return [i for i in self._list(MANAGED_FILTER + self._mine) if i.managed]

    def attempt_instances(self, job_id: str, attempt: int) -> list[Instance]:
        found = self._list(f'{MANAGED_FILTER}{self._mine} AND labels.{LABEL_JOB_ID} = "{job_id}" '
                           f'AND labels.{LABEL_ATTEMPT} = "{attempt}"')
        return sorted(found, key=lambda i: (i.rank if i.rank is not None else 1 << 30, i.id))

    def find(self, instance_id: str) -> tuple[Instance, str] | None:
        """The VM named by zone/name in this project, with GCE's numeric id; None if there is none (managed or
        not: the caller decides what its labels mean)."""
        zone, _, name = instance_id.partition("/")
        try:
            vm = self._instances.get(project=self.project, zone=zone, instance=name)
        except self._errors.NotFound:
            return None
        return to_instance(vm), str(vm.id)

    # ---- terminate ---------------------------------------------------------------------------------
    def terminate(self, instance_ids: list[str]) -> None:
        """Delete managed, unprotected VMs; anything else is skipped and logged. Missing VMs are fine."""
        for instance_id in instance_ids:
            zone, _, name = instance_id.partition("/")
            try:
                vm = self._instances.get(project=self.project, zone=zone, instance=name)
                labels = dict(vm.labels)
                theirs = self.deployment and labels.get(LABEL_DEPLOYMENT) != deployment_label(self.deployment)
                if labels.get(LABEL_MANAGED) != "true" or theirs or vm.deletion_protection:
                    log.warning("refusing to delete %s: unmanaged, another deployment's or deletion-protected",
                                instance_id)
                    continue
                self._instances.delete_unary(self._v1.DeleteInstanceRequest(
                    project=self.project, zone=zone, instance=name,
                    request_id=str(uuid.uuid5(_REQUEST_NAMESPACE, f"delete/{instance_id}/{vm.id}"))))
            except self._errors.NotFound:
                continue  # already gone

    def console_output(self, instance_id: str) -> str:
        """Serial port 1: where the guest's console and the startup script's output go."""
        zone, _, name = instance_id.partition("/")
        output = self._instances.get_serial_port_output(self._v1.GetSerialPortOutputInstanceRequest(
            project=self.project, zone=zone, instance=name, port=1))
        return str(output.contents)

    # ---- preemptions seen after the fact -----------------------------------------------------------
    def preempted(self, since: datetime | None = None) -> list[Preemption]:
        """compute.instances.preempted operations (all zones, one paginated call), oldest first."""
        pages = self._global_ops.aggregated_list(self._v1.AggregatedListGlobalOperationsRequest(
            project=self.project, filter=f'operationType = "{PREEMPTED_OPERATION}"', max_results=500))
        out = []
        for _, scoped in pages:
            for op in scoped.operations:
                at = _time(op.insert_time)
                if op.operation_type == PREEMPTED_OPERATION and (since is None or at >= since):
                    parts = op.target_link.split("/")
                    out.append(Preemption(f"{parts[-3]}/{parts[-1]}", at))
        return sorted(out, key=lambda p: p.at)
