"""What only tests need of the Compute fake: capacity and quota errors on demand, a VM's serial output set
by hand, a metadata server per VM started on request (and told of a preemption notice), and maxRunDuration
applied in one call. The local cloud's instance runner does the last three itself, per VM."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

from jobplane.local.fake_compute import FakeComputeServer
from jobplane.local.gce_metadata_server import FakeGceMetadataServer


class MetadataFake(FakeGceMetadataServer):
    """The metadata server, counting the requests it answers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests = 0

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests += 1
        super().handle(handler)


@dataclass
class _Failure:
    code: str
    times: int | None  # launches left to fail; None = until restored


class ComputeFake(FakeComputeServer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._failures: dict[str, _Failure] = {}
        self._metadata: dict[str, MetadataFake] = {}
        self._consoles: dict[str, str] = {}

    def stop(self) -> None:
        for metadata in self._metadata.values():
            metadata.stop()
        self._metadata.clear()
        super().stop()

    # -- capacity ---------------------------------------------------------------------------------
    def fail_zone(self, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED", times: int | None = None) -> None:
        """Make launches in zone fail with code (for `times` launches, or until restore_zone)."""
        with self._lock:
            self._failures[zone] = _Failure(code, times)

    def restore_zone(self, zone: str) -> None:
        with self._lock:
            self._failures.pop(zone, None)

    def _capacity_error(self, zone: str) -> str | None:
        failure = self._failures.get(zone)
        if failure is None:
            return None
        if failure.times is not None:
            failure.times -= 1
            if failure.times <= 0:
                del self._failures[zone]
        return failure.code

    # -- a VM's guest -----------------------------------------------------------------------------
    def set_console(self, instance_id: str, text: str) -> None:
        """What the VM's guest printed to serial port 1 (a test runs the real startup script and hands its
        output here)."""
        zone, _, name = instance_id.partition("/")
        with self._lock:
            self._vm(zone, name).console = text

    def metadata_server(self, instance_id: str) -> MetadataFake:
        """A running fake metadata server answering as this VM would (one per VM, stopped with this server)."""
        zone, name = instance_id.split("/", 1)
        with self._lock:
            if instance_id in self._metadata:
                return self._metadata[instance_id]
            res = self._vm(zone, name).resource
            attributes = {i["key"]: i.get("value", "") for i in res.get("metadata", {}).get("items", [])}
            server = MetadataFake(
                instance_id=res["id"], name=name, zone=zone, project=self.project, attributes=attributes,
                ip=res["networkInterfaces"][0]["networkIP"], machine_type=res["machineType"].rsplit("/", 1)[-1])
            self._metadata[instance_id] = server
        server.start()
        return server

    def preempt(self, instance_id: str, *, notice_only: bool = False) -> None:
        """Spot preemption: the metadata server says TRUE at once; then (unless notice_only) the VM ends and
        the operation is recorded."""
        metadata = self._metadata.get(instance_id)
        if metadata is not None:
            metadata.set_preempted()
        if not notice_only:
            super().preempt(instance_id)

    def expire(self) -> list[str]:
        """Apply scheduling.maxRunDuration to every VM past it, as GCE does on its own."""
        now, due = self.clock(), []
        for vm in self.instances():
            seconds = int(vm.get("scheduling", {}).get("maxRunDuration", {}).get("seconds", 0))
            created = self._vms[(vm["zone"].rsplit("/", 1)[-1], vm["name"])].created
            if seconds and vm["status"] != "TERMINATED" and now >= created + timedelta(seconds=seconds):
                due.append(f"{vm['zone'].rsplit('/', 1)[-1]}/{vm['name']}")
        for instance_id in due:
            self.end(instance_id)
        return due
