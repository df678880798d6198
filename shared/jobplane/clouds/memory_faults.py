"""The in-memory cloud under faults (jobplane.clouds.faults), for day tests on the manual clock.

What reaches the control plane is what outlived the SDK's retries: a throttle or server error (ApiFailed), a
call that took effect but whose answer never came (ApiFailed after the work was done), a multi-node launch
refused for capacity, and listings that show a new instance only some seconds after its launch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

from jobplane.clouds.base import (
    Blob,
    CapacityError,
    Compute,
    Instance,
    LaunchRequest,
    ObjectInfo,
    StoreError,
)
from jobplane.clouds.faults import ApiFailed, Faults, Kind
from jobplane.clouds.memory import MemoryStore

T = TypeVar("T")
_TOKEN = re.compile(r"-[0-9a-f]{4,}\b")  # the random part of an event's stamp: a seed's draws must not depend on it


class StoreFailed(StoreError):
    """An object store's throttle or server error that outlived the SDK's retries."""


class FaultyStore:
    """An ObjectStore (MemoryStore) behind a faulty API: a read or write fails with `service`'s error, and a write
    whose answer was lost is sent again by the SDK (a conditional write's resend then fails on its own write)."""

    def __init__(self, inner: MemoryStore, faults: Faults, service: str = "s3") -> None:
        self.inner, self.faults, self.service = inner, faults, service
        self.bucket, self.limits, self.vm_auth = inner.bucket, inner.limits, inner.vm_auth

    def _read(self, call: str, key: str) -> None:
        if (fault := self.faults.draw(self.service, call, _TOKEN.sub("", key))) is not None:
            raise StoreFailed(f"{fault.error.status} {fault.error.code}: {key}")

    def _write(self, call: str, key: str, write: Callable[[], T]) -> T:
        fault = self.faults.draw(self.service, call, _TOKEN.sub("", key), mutates=True)
        if fault is not None and fault.kind is Kind.LOST:
            write()  # it landed; its answer was lost, and the SDK sends it again
        elif fault is not None:
            raise StoreFailed(f"{fault.error.status} {fault.error.code}: {key}")
        return write()

    def get(self, key: str) -> Blob:
        self._read("get", key)
        return self.inner.get(key)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        self._read("list", prefix)
        return self.inner.list(prefix, page_size)

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        self._read("folders", prefix)
        return self.inner.folders(prefix, page_size)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._write("put", key, lambda: self.inner.put(key, data, content_type))

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        return self._write("create", key, lambda: self.inner.put_if_absent(key, data, content_type, tags))

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        return self._write("cas", key, lambda: self.inner.put_if_match(key, data, version, content_type))

    def delete(self, key: str) -> None:
        self._write("delete", key, lambda: self.inner.delete(key))

    def __getattr__(self, name: str) -> Any:  # file transfers and presigned URLs: the store's own
        return getattr(self.inner, name)


class FaultyCompute:
    """A Compute (MemoryCompute's, or a view of it) behind a faulty API: `service`'s errors at the faults' rate."""

    def __init__(self, inner: Compute, faults: Faults, clock: Callable[[], datetime], service: str = "ec2") -> None:
        self.inner, self.faults, self.clock, self.service = inner, faults, clock, service
        self.cloud, self.region = inner.cloud, inner.region
        self.hidden = 0  # listings that left out an instance not yet visible

    def _fail(self, call: str, key: str, *, mutates: bool = False, nodes: int = 1,
              effect: Callable[[], object] | None = None) -> None:
        fault = self.faults.draw(self.service, call, key, mutates=mutates, nodes=nodes)
        if fault is None:
            return
        if fault.kind is Kind.CAPACITY:
            raise CapacityError(fault.error.code, fault.error.message)
        if fault.kind is Kind.LOST and effect is not None:
            effect()  # it took effect; its answer was lost
        raise ApiFailed(self.service, fault.error)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        self._fail("launch", f"{request.job_id}/{request.attempt}", mutates=True, nodes=request.num_nodes,
                   effect=lambda: self.inner.launch(request))
        return self.inner.launch(request)

    def list_managed(self) -> list[Instance]:
        self._fail("list", "")
        now = self.clock()
        listed = self.inner.list_managed()
        shown = [i for i in listed if (now - i.launched_at).total_seconds() >= self.faults.visible_after(i.id)]
        self.hidden += len(listed) - len(shown)
        return shown

    def terminate(self, instance_ids: list[str]) -> None:
        self._fail("terminate", ",".join(sorted(instance_ids)), mutates=True,
                   effect=lambda: self.inner.terminate(instance_ids))
        self.inner.terminate(instance_ids)

    def console_output(self, instance_id: str) -> str:
        self._fail("console", instance_id)
        return self.inner.console_output(instance_id)
