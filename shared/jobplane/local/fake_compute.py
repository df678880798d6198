"""A local fake of the Compute Engine REST API, good enough for the real google-cloud-compute client.

google-cloud-compute has no emulator. This fake speaks what the client sends with transport="rest",
AnonymousCredentials and client_options api_endpoint=<endpoint>: instances insert / bulkInsert (zonal
and regional) / get / delete / aggregatedList with a label filter, zone and region operations get /
wait, aggregated operations with an operationType filter, and serial port 1's output. It enforces the rules
the adapter could get wrong: resource names and labels, requestId UUIDs and their idempotency, count /
minCount / namePattern, maxRunDuration needing a termination action, existing names (409), and
guestAccelerators (an accelerator type the zone has, on an N1 machine type, onHostMaintenance TERMINATE: a GPU
VM cannot live-migrate). Every VM's networkIP is on loopback (127.102.0.0/16), so an address a local VM or its
job sees is on this machine.

What GCE does on its own, for the local cloud's instance runner (jobplane.local.gce_runner): power_off (the
guest shut down: TERMINATED), end (maxRunDuration reached: deleted or stopped as the VM's scheduling says),
preempt (the same, with a compute.instances.preempted operation recorded), add_instance (a VM the control
plane did not create). Serial port output is read from <consoles>/<zone>/<name>/console.log, where the
runner keeps what the VM printed. Out of scope: disks, networks, images and machine types as resources
(their names are only echoed).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jobplane.local import gce_permissions
from jobplane.local.loopback import LoopbackServer, send_json
from jobplane.local.module_iam import FunctionGrants

_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(_P + pattern), handler)
    for method, pattern, handler in [
        ("POST", r"/zones/(?P<zone>[^/]+)/instances", "_insert"),
        ("POST", r"/zones/(?P<zone>[^/]+)/instances/bulkInsert", "_bulk_insert"),
        ("POST", r"/regions/(?P<region>[^/]+)/instances/bulkInsert", "_region_bulk_insert"),
        ("GET", r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "_get_instance"),
        ("GET", r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/serialPort", "_serial_port"),
        ("DELETE", r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "_delete_instance"),
        ("GET", r"/aggregated/instances", "_aggregated_instances"),
        ("GET", r"/(?P<scope>zones|regions)/(?P<where>[^/]+)/operations/(?P<op>[^/]+)", "_get_operation"),
        ("POST", r"/(?P<scope>zones|regions)/(?P<where>[^/]+)/operations/(?P<op>[^/]+)/wait", "_wait_operation"),
        ("GET", r"/aggregated/operations", "_aggregated_operations"),
    ]
]
# handler -> the call it is, as `calls` counts it and jobplane.local.gce_permissions names it
_CALLS = {"_insert": "insert", "_bulk_insert": "bulkInsert", "_region_bulk_insert": "regionBulkInsert",
          "_get_instance": "get", "_serial_port": "getSerialPortOutput", "_delete_instance": "delete",
          "_aggregated_instances": "aggregatedList", "_get_operation": "getOperation",
          "_wait_operation": "waitOperation", "_aggregated_operations": "aggregatedOperations"}
# One term of a list filter: labels.KEY = "VALUE", or FIELD = VALUE / FIELD != VALUE, optionally in ().
_TERM = re.compile(r'\(?\s*(?P<field>[A-Za-z][\w.-]*)\s*(?P<op>=|!=|eq|ne)\s*"?(?P<value>[^")\s]*)"?\s*\)?')

DEFAULT_ZONES = {"us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]}
LOOPBACK_SUBNET = ipaddress.ip_network("127.102.0.0/16")  # beside the AWS local cloud's 127.100.0.0/16
PREEMPTED = "compute.instances.preempted"
CONSOLE_BYTES = 1 << 20  # GCE keeps the last 1 MiB of serial port output
_ACCELERATOR_TYPE = re.compile(r"(?:.*/)?zones/(?P<zone>[^/]+)/acceleratorTypes/(?P<name>[^/]+)|(?P<bare>[a-z0-9-]+)")
# The N1-attachable GPUs every fake zone has unless a test says otherwise (accelerator_types)
DEFAULT_ACCELERATORS = frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4"})


class _HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat(timespec="milliseconds")


@dataclass
class _Vm:
    zone: str
    name: str
    resource: dict[str, Any]
    created: datetime
    console: str = ""  # what the guest printed (serial port 1), when no consoles directory says


@dataclass
class _Op:
    resource: dict[str, Any]
    polls_left: int
    on_done: list[Callable[[], None]] = field(default_factory=list)


class FakeComputeServer(LoopbackServer):
    """Thread-safe Compute Engine fake on 127.0.0.1; use as a context manager or start()/stop().

    op_polls: how many GETs of an operation answer RUNNING before DONE (a wait completes it at once),
    so callers' polling loops are exercised.
    """

    def __init__(
        self,
        project: str = "jobplane-local",
        zones: dict[str, list[str]] | None = None,
        *,
        op_polls: int = 1,
        clock: Callable[[], datetime] | None = None,
        consoles: Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.project = project
        self.zones = {z: region for region, zs in (zones or DEFAULT_ZONES).items() for z in zs}
        self.op_polls = op_polls
        self.clock = clock or (lambda: datetime.now(UTC))
        self.consoles = consoles
        # zone -> the accelerator types it offers (acceleratorTypes.list); a zone not named has the defaults
        self.accelerator_types: dict[str, frozenset[str]] = {}
        self.calls: Counter[str] = Counter()  # "insert", "bulkInsert", "aggregatedList", ... (tests, bench)
        # token -> what IAM grants it (enforce()); a request with any other token, or none, is not checked
        self._enforced: dict[str, tuple[FunctionGrants, str, str]] = {}
        super().__init__(host, port)
        self._lock = threading.Lock()
        self._vms: dict[tuple[str, str], _Vm] = {}
        self._ops: dict[str, _Op] = {}
        self._requests: dict[str, str] = {}  # requestId -> operation name
        self._ids = itertools.count(1_000_000_001)
        self._addresses = itertools.count(256)  # LOOPBACK_SUBNET's hosts from 127.102.1.0 on

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """For client_options api_endpoint, e.g. http://127.0.0.1:PORT."""
        return f"http://{self.address}"

    # -- what GCE does on its own ----------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        """Every VM's resource, as the API would return it."""
        with self._lock:
            return [json.loads(json.dumps(vm.resource)) for vm in self._vms.values()]

    def add_instance(
        self, zone: str, name: str, labels: dict[str, str] | None = None, *,
        deletion_protection: bool = False, created: datetime | None = None, status: str = "RUNNING",
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Seed a VM directly (e.g. one the control plane did not create); returns its id zone/name."""
        body: dict[str, Any] = {"name": name, "machineType": f"zones/{zone}/machineTypes/e2-small",
                                "labels": labels or {}, "deletionProtection": deletion_protection}
        if metadata:
            body["metadata"] = {"items": [{"key": k, "value": v} for k, v in metadata.items()]}
        with self._lock:
            vm = self._create(zone, body, created)
            vm.resource["status"] = status
        return f"{zone}/{name}"

    def power_off(self, instance_id: str) -> None:
        """The guest shut itself down (the agent's power-off): GCE keeps the VM, TERMINATED, with its disk.
        Deleted meanwhile: no-op."""
        zone, name = instance_id.split("/", 1)
        with self._lock:
            vm = self._vms.get((zone, name))
            if vm is not None:
                vm.resource["status"] = "TERMINATED"

    def status(self, instance_id: str) -> str | None:
        """The VM's status (RUNNING, TERMINATED...), None once it is deleted."""
        zone, name = instance_id.split("/", 1)
        with self._lock:
            vm = self._vms.get((zone, name))
            return str(vm.resource["status"]) if vm is not None else None

    def end(self, instance_id: str, operation: str | None = None) -> None:
        """GCE ends the VM itself (maxRunDuration, a preemption): deleted, or stopped if its scheduling's
        instanceTerminationAction says STOP; operation: the system operation to record. Gone already: no-op."""
        zone, name = instance_id.split("/", 1)
        with self._lock:
            vm = self._vms.get((zone, name))
            if vm is not None:
                self._end(vm, operation)

    def preempt(self, instance_id: str) -> None:
        """Spot preemption, the part after the guest's ~30 s: the VM ends and the operation is recorded (the
        notice, instance/preempted, is the VM's metadata server's)."""
        self.end(instance_id, PREEMPTED)

    # -- HTTP plumbing ---------------------------------------------------------------------------

    def enforce(self, token: str, grants: FunctionGrants, name_prefix: str, vm_account: str) -> None:
        """Hold requests bearing `token` to these grants (jobplane.local.module_iam: the functions' service
        account's), as GCE's IAM would: name_prefix, the deployment's VM names (functions_own_vms' condition);
        vm_account, the service account the grants may attach to a VM."""
        self._enforced[token] = (grants, name_prefix, vm_account)

    def _authorize(self, handler: BaseHTTPRequestHandler, name: str, params: dict[str, str],
                   payload: dict[str, Any]) -> None:
        kind, _, token = str(handler.headers.get("Authorization") or "").partition(" ")
        enforced = self._enforced.get(token.strip()) if kind.lower() == "bearer" else None
        if enforced is None:
            return
        if "zone" in params:
            where = f"zones/{params['zone']}"
        elif "region" in params:
            where = f"regions/{params['region']}"
        else:
            where = f"{params['scope']}/{params['where']}" if "scope" in params else "global"
        bodies = ([payload] if name == "_insert" else
                  self._bulk_bodies(payload) if name in ("_bulk_insert", "_region_bulk_insert") else [])
        refused = gce_permissions.denied(*enforced, _CALLS[name], where, [params.get("name")], bodies)
        if refused is not None:
            permission, resource = refused
            raise _HttpError(403, "forbidden",
                             f"Required '{permission}' permission for 'projects/{self.project}/{resource}'")

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        args = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        status, body = 200, {}
        try:
            payload = json.loads(raw) if raw.strip() else {}
            for method, pattern, name in _ROUTES:
                match = pattern.fullmatch(url.path)
                if match and method == handler.command:
                    params = match.groupdict()
                    if params.pop("project") != self.project:
                        raise _HttpError(404, "notFound", f"The resource 'projects/{match['project']}' was not found")
                    self._authorize(handler, name, params, payload)
                    with self._lock:
                        body = getattr(self, name)(args, payload, **params)
                    break
            else:
                raise _HttpError(404, "notFound", f"No route for {handler.command} {url.path}")
        except _HttpError as err:
            status = err.code
            body = {"error": {"code": err.code, "message": err.message,
                              "errors": [{"message": err.message, "domain": "global", "reason": err.reason}]}}
        except ValueError as err:
            status, body = 400, {"error": {"code": 400, "message": str(err),
                                           "errors": [{"message": str(err), "reason": "parseError"}]}}
        send_json(handler, status, body)

    # -- helpers (lock held) ---------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.endpoint}/compute/v1/projects/{self.project}/{path}"

    def _zone(self, zone: str) -> str:
        if zone not in self.zones:
            raise _HttpError(400, "invalid", f"Invalid value for field 'zone': '{zone}'. Unknown zone.")
        return zone

    def _vm(self, zone: str, name: str) -> _Vm:
        vm = self._vms.get((zone, name))
        if vm is None:
            raise _HttpError(404, "notFound",
                             f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
        return vm

    def _idempotent(self, args: dict[str, str], start: Callable[[], _Op]) -> dict[str, Any]:
        """A requestId seen before returns its operation instead of acting again (as GCE does)."""
        request_id = args.get("requestId")
        if request_id is not None:
            try:
                uuid.UUID(request_id)
            except ValueError:
                raise _HttpError(400, "invalid", f"Invalid value for field 'requestId': '{request_id}'. "
                                                 "Must be a valid UUID.") from None
            if request_id in self._requests:
                return self._ops[self._requests[request_id]].resource
        op = start()
        if request_id is not None:
            self._requests[request_id] = op.resource["name"]
        return op.resource

    def _operation(
        self, kind: str, where: str, target: str, error: str | None = None, vms: list[_Vm] | None = None
    ) -> _Op:
        """A new operation; when it completes, the VMs it created go from STAGING to RUNNING."""
        scope = "zones" if where in self.zones else "regions"
        name = f"operation-{uuid.uuid4().hex[:20]}"
        now = _rfc3339(self.clock())
        resource: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name, "operationType": kind,
            "targetLink": self._url(target), "status": "RUNNING", "progress": 0, "insertTime": now,
            "startTime": now, "selfLink": self._url(f"{scope}/{where}/operations/{name}"),
            scope[:-1]: self._url(f"{scope}/{where}"), "user": "jobplane@fake",
        }
        if error is not None:
            code, status = (403, "FORBIDDEN") if "QUOTA" in error else (503, "SERVICE UNAVAILABLE")
            message = (f"Quota exceeded in region {self.zones.get(where, where)}." if "QUOTA" in error else
                       f"The zone 'projects/{self.project}/zones/{where}' does not have enough resources "
                       "available to fulfill the request.  Try a different zone, or try again later.")
            resource.update(error={"errors": [{"code": error, "message": message}]},
                            httpErrorStatusCode=code, httpErrorMessage=status)
        op = _Op(resource, self.op_polls)
        self._ops[name] = op
        if vms:
            created = list(vms)

            def running() -> None:
                for vm in created:
                    vm.resource["status"] = "RUNNING"

            op.on_done.append(running)
        if op.polls_left <= 0:
            self._finish(op)
        return op

    def _finish(self, op: _Op) -> None:
        if op.resource["status"] != "DONE":
            op.resource.update(status="DONE", progress=100, endTime=_rfc3339(self.clock()))
            for callback in op.on_done:
                callback()

    def _capacity_error(self, zone: str) -> str | None:
        """The error code a launch in zone fails with, or None (tests inject capacity and quota errors)."""
        return None

    def _validate(self, body: dict[str, Any], zone: str) -> None:
        labels = body.get("labels", {})
        if len(labels) > 64:
            raise _HttpError(400, "invalid", "Labels: at most 64 labels")
        for key, value in labels.items():
            if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
                raise _HttpError(400, "invalid", f"Invalid value for field 'resource.labels': '{key}={value}'")
        if not body.get("machineType"):
            raise _HttpError(400, "required", "Required field 'resource.machineType' not specified")
        scheduling = body.get("scheduling", {})
        if scheduling.get("maxRunDuration") and not scheduling.get("instanceTerminationAction"):
            raise _HttpError(400, "invalid", "maxRunDuration requires instanceTerminationAction")
        if scheduling.get("provisioningModel") == "SPOT" and scheduling.get("automaticRestart"):
            raise _HttpError(400, "invalid", "Spot VMs cannot have automaticRestart")
        self._validate_accelerators(body, zone)

    def _offers(self, zone: str, body: dict[str, Any]) -> bool:
        """Whether the zone has every accelerator type the VM asks for."""
        names = {str(a.get("acceleratorType", "")).rsplit("/", 1)[-1] for a in body.get("guestAccelerators") or []}
        return names <= self.accelerator_types.get(zone, DEFAULT_ACCELERATORS)

    def _validate_accelerators(self, body: dict[str, Any], zone: str) -> None:
        """GCE's rules for guestAccelerators: a partial or full URL naming the VM's own zone (an instance
        template or bulkInsert's instanceProperties: the bare name), a type the zone has (else 400 not
        found, as GCE answers), a machine type that takes GPUs (N1 here), and no live migration."""
        accelerators = body.get("guestAccelerators") or []
        machine = body["machineType"].rsplit("/", 1)[-1]
        for i, accelerator in enumerate(accelerators):
            given, count = str(accelerator.get("acceleratorType", "")), int(accelerator.get("acceleratorCount", 0))
            m = _ACCELERATOR_TYPE.fullmatch(given)
            if m is None or (m["zone"] is not None and m["zone"] != zone) or count < 1:
                raise _HttpError(400, "invalid", f"Invalid value for field 'resource.guestAccelerators[{i}]': "
                                                 f"'{given}' x {count}")
            name = m["name"] or m["bare"]
            if name not in self.accelerator_types.get(zone, DEFAULT_ACCELERATORS):
                raise _HttpError(400, "badRequest", f"The resource 'projects/{self.project}/zones/{zone}/"
                                                    f"acceleratorTypes/{name}' was not found")
            if not machine.startswith("n1-"):
                raise _HttpError(400, "badRequest", f"[{name}, {machine}] features are not compatible for "
                                                    "creating instance.")
        if accelerators and body.get("scheduling", {}).get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise _HttpError(400, "badRequest", "Instances with guest accelerators do not support live migration.")

    def _create(self, zone: str, body: dict[str, Any], created: datetime | None = None) -> _Vm:
        name = body.get("name", "")
        if not _NAME.fullmatch(name):
            raise _HttpError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        if (zone, name) in self._vms:
            raise _HttpError(409, "alreadyExists",
                             f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        vm_id = next(self._ids)
        created = created or self.clock()
        machine = body["machineType"].rsplit("/", 1)[-1]
        resource = {
            **body, "kind": "compute#instance", "id": str(vm_id), "status": "STAGING",
            "zone": self._url(f"zones/{zone}"), "machineType": self._url(f"zones/{zone}/machineTypes/{machine}"),
            "creationTimestamp": _rfc3339(created), "selfLink": self._url(f"zones/{zone}/instances/{name}"),
            **({"guestAccelerators": [
                {**a, "acceleratorType": self._url(f"zones/{zone}/acceleratorTypes/"
                                                   + str(a["acceleratorType"]).rsplit("/", 1)[-1])}
                for a in body["guestAccelerators"]]} if body.get("guestAccelerators") else {}),
            "networkInterfaces": [{**(body.get("networkInterfaces") or [{}])[0], "name": "nic0",
                                   "networkIP": str(LOOPBACK_SUBNET[next(self._addresses)])}],
        }
        vm = _Vm(zone, name, resource, created)
        self._vms[(zone, name)] = vm
        return vm

    def _launch(self, kind: str, where: str, zone: str, bodies: list[dict[str, Any]]) -> _Op:
        """Create every VM or none: an injected failure fails the whole operation."""
        error = self._capacity_error(zone)
        for body in bodies:
            self._validate(body, zone)
        target = f"zones/{zone}/instances/{bodies[0]['name']}" if kind == "insert" else f"zones/{zone}/instances"
        if error is not None:
            return self._operation(kind, where, target, error)
        for body in bodies:
            if (zone, body["name"]) in self._vms:
                self._create(zone, body)  # raises 409 before anything is created
        vms = [self._create(zone, body) for body in bodies]
        return self._operation(kind, where, target, vms=vms)

    def _end(self, vm: _Vm, kind: str | None) -> None:
        """The VM ends as its scheduling says: DELETE removes it, STOP leaves it TERMINATED. kind: the
        system operation to record (preemption); none for maxRunDuration, whose record this fake omits."""
        if kind is not None:
            self._finish(self._operation(kind, vm.zone, f"zones/{vm.zone}/instances/{vm.name}"))
        if vm.resource.get("scheduling", {}).get("instanceTerminationAction", "DELETE") == "STOP":
            vm.resource["status"] = "TERMINATED"
        else:
            self._vms.pop((vm.zone, vm.name), None)

    @staticmethod
    def _bulk_bodies(resource: dict[str, Any]) -> list[dict[str, Any]]:
        count, min_count = int(resource.get("count", 0)), int(resource.get("minCount", resource.get("count", 0)))
        pattern = resource.get("namePattern", "")
        hashes = re.search(r"#+", pattern)
        if count < 1 or not 1 <= min_count <= count:
            raise _HttpError(400, "invalid", f"Invalid count {count} / minCount {min_count}")
        if hashes is None or len(str(count)) > len(hashes.group()):
            raise _HttpError(400, "invalid", f"Invalid value for field 'namePattern': '{pattern}'")
        props = resource.get("instanceProperties")
        if not props:
            raise _HttpError(400, "required", "Required field 'instanceProperties' not specified")
        width = len(hashes.group())
        names = [pattern[: hashes.start()] + str(i).zfill(width) + pattern[hashes.end():] for i in range(1, count + 1)]
        return [{**json.loads(json.dumps(props)), "name": name} for name in names]

    # -- handlers (lock held) --------------------------------------------------------------------

    def _insert(self, args: dict[str, str], body: dict[str, Any], zone: str) -> dict[str, Any]:
        self.calls["insert"] += 1
        self._zone(zone)
        return self._idempotent(args, lambda: self._launch("insert", zone, zone, [body]))

    def _bulk_insert(self, args: dict[str, str], body: dict[str, Any], zone: str) -> dict[str, Any]:
        self.calls["bulkInsert"] += 1
        self._zone(zone)
        return self._idempotent(args, lambda: self._launch("bulkInsert", zone, zone, self._bulk_bodies(body)))

    def _region_bulk_insert(self, args: dict[str, str], body: dict[str, Any], region: str) -> dict[str, Any]:
        self.calls["regionBulkInsert"] += 1
        zones = [z for z, r in self.zones.items() if r == region]
        if not zones:
            raise _HttpError(400, "invalid", f"Invalid value for field 'region': '{region}'")
        shape = body.get("locationPolicy", {}).get("targetShape")
        if shape != "ANY_SINGLE_ZONE":
            raise _HttpError(400, "invalid", "this fake supports locationPolicy.targetShape ANY_SINGLE_ZONE only")
        bodies = self._bulk_bodies(body)

        def start() -> _Op:
            errors = []
            for zone in zones:  # ANY_SINGLE_ZONE: all VMs in the first zone with room (and the GPUs asked for)
                if not self._offers(zone, bodies[0]) and zone != zones[-1]:
                    continue
                if (error := self._capacity_error(zone)) is None:
                    for b in bodies:
                        self._validate(b, zone)
                    vms = [self._create(zone, b) for b in bodies]
                    return self._operation("bulkInsert", region, f"regions/{region}/instances", vms=vms)
                errors.append(error)
            return self._operation("bulkInsert", region, f"regions/{region}/instances", errors[0])

        return self._idempotent(args, start)

    def _get_instance(self, args: dict[str, str], body: dict[str, Any], zone: str, name: str) -> dict[str, Any]:
        self.calls["get"] += 1
        return self._vm(zone, name).resource

    def _serial_port(self, args: dict[str, str], body: dict[str, Any], zone: str, name: str) -> dict[str, Any]:
        self.calls["getSerialPortOutput"] += 1
        if args.get("port", "1") != "1":
            raise _HttpError(400, "invalid", "only serial port 1 has output here")
        vm = self._vm(zone, name)
        path = self.consoles / zone / name / "console.log" if self.consoles else None
        text = path.read_bytes()[-CONSOLE_BYTES:].decode(errors="replace") if path and path.is_file() else vm.console
        return {"kind": "compute#serialPortOutput", "contents": text, "start": "0", "next": str(len(text)),
                "selfLink": self._url(f"zones/{zone}/instances/{name}/serialPort")}

    def _delete_instance(self, args: dict[str, str], body: dict[str, Any], zone: str, name: str) -> dict[str, Any]:
        self.calls["delete"] += 1

        def start() -> _Op:
            vm = self._vm(zone, name)
            if vm.resource.get("deletionProtection"):
                raise _HttpError(400, "resourceInUseByAnotherResource",
                                 f"Instance '{name}' has deletionProtection enabled")
            del self._vms[(zone, name)]
            return self._operation("delete", zone, f"zones/{zone}/instances/{name}")

        return self._idempotent(args, start)

    def _get_operation(self, args: dict[str, str], body: dict[str, Any], scope: str, where: str,
                       op: str) -> dict[str, Any]:
        """operations.get: an operation stays RUNNING for its first op_polls polls."""
        found = self._counted_operation("getOperation", scope, where, op)
        if found.polls_left > 0:
            found.polls_left -= 1
        else:
            self._finish(found)
        return found.resource

    def _wait_operation(self, args: dict[str, str], body: dict[str, Any], scope: str, where: str,
                        op: str) -> dict[str, Any]:
        """operations.wait: returns once the operation is DONE."""
        found = self._counted_operation("waitOperation", scope, where, op)
        self._finish(found)
        return found.resource

    def _counted_operation(self, call: str, scope: str, where: str, op: str) -> _Op:
        self.calls[call] += 1
        found = self._ops.get(op)
        if found is None:
            raise _HttpError(404, "notFound", f"The resource '{scope}/{where}/operations/{op}' was not found")
        return found

    @staticmethod
    def _matches(resource: dict[str, Any], expression: str) -> bool:
        """A conjunction of `field = value` / `field != value` terms; OR is not supported (400)."""
        if re.search(r"\bOR\b", expression):
            raise _HttpError(400, "invalid", "this fake supports AND filters only")
        rest = re.sub(r"\bAND\b", " ", expression)
        for term in _TERM.finditer(rest):
            path, op, want = term["field"].split("."), term["op"], term["value"]
            value: Any = resource
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            equal = str(value) == want if value is not None else False
            if equal != (op in ("=", "eq")):
                return False
        if _TERM.sub("", rest).strip():
            raise _HttpError(400, "invalid", f"Invalid list filter expression '{expression}'")
        return True

    def _paged(self, args: dict[str, str], kind: str, key: str, items: list[tuple[str, dict[str, Any]]],
               ) -> dict[str, Any]:
        """One page of an aggregated list: {"items": {"zones/Z": {key: [...]}}, "nextPageToken"}."""
        limit = min(int(args.get("maxResults", 500)), 500)
        start = int(args.get("pageToken", "0") or 0)
        page = items[start:start + limit]
        grouped: dict[str, dict[str, Any]] = {}
        for scope, resource in page:
            grouped.setdefault(scope, {key: []})[key].append(resource)
        out: dict[str, Any] = {"kind": kind, "id": f"projects/{self.project}/aggregated/{key}", "items": grouped}
        if start + limit < len(items):
            out["nextPageToken"] = str(start + limit)
        return out

    def _aggregated_instances(self, args: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.calls["aggregatedList"] += 1
        expression = args.get("filter", "")
        items = [(f"zones/{vm.zone}", vm.resource) for _, vm in sorted(self._vms.items())
                 if self._matches(vm.resource, expression)]
        return self._paged(args, "compute#instanceAggregatedList", "instances", items)

    def _aggregated_operations(self, args: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.calls["aggregatedOperations"] += 1
        expression = args.get("filter", "")
        items = []
        for op in self._ops.values():
            scope = op.resource.get("zone") or op.resource.get("region", "")
            if self._matches(op.resource, expression):
                items.append(("/".join(scope.rsplit("/", 2)[-2:]), op.resource))
        return self._paged(args, "compute#operationAggregatedList", "operations", items)
