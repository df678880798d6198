"""One registry's objects: an ObjectStore under the registry's root prefix (docs/architecture.md, Registry layout).

Callers name keys relative to the root (jobplane.model.keys) and go through these methods, never through `store`
(tests/test_no_reaching_through.py): raw bytes and JSON, create-only and compare-and-swap writes, listings, presigned
URLs for VMs, and reads of create-only objects kept once read (get_created). What a key means is the caller's: an
agent writes its facts here, and the job registry (jobplane.store.registry) keeps job records, events and markers on
top.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from jobplane.clouds.base import Blob, NotFound, ObjectInfo, ObjectStore, VmUrls
from jobplane.model import keys

CAS_RETRIES = 20  # conflicting writes a compare-and-swap writer (a job's record, a sweep's) sits out before it gives up
CREATED_CACHE_BYTES = 32 << 20  # what one store keeps of create-only objects it read (get_created), oldest out first


class RegistryError(Exception):
    """A record the registry keeps is not as the caller needs it (exists, missing, moved on, unreadable), or its
    compare-and-swap gave up."""


def backoff(tries: int) -> None:
    """Full-jitter exponential backoff: contending writers spread apart so a hot record converges."""
    time.sleep(random.uniform(0, min(1.0, 0.01 * 2**tries)))


class RootedStore:
    """The objects of one registry (a bucket plus an optional root prefix), by keys relative to the root."""

    def __init__(self, store: ObjectStore, root: str = "") -> None:
        self.store = store
        self.root = keys.root_prefix(root)
        self._created: dict[str, bytes] = {}  # get_created's, in the order read
        self._created_bytes = 0
        self._created_lock = threading.Lock()  # a dashboard's request threads share its store

    def key(self, key: str) -> str:
        return self.root + key

    def _unroot(self, key: str) -> str:
        return key[len(self.root):]

    def get_object(self, key: str) -> Blob:
        """The object with its version and LastModified (NotFound if absent)."""
        return self.store.get(self.key(key))

    def get_bytes(self, key: str) -> bytes:
        return self.get_object(key).data

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def get_created(self, key: str) -> bytes:
        """get_bytes, for an object written once and never again (an event, a metrics or system chunk: each
        create-only under a name of its own): read from the bucket once per store. A long-lived reader (the
        dashboard, a notebook's client) polling a running job reads only what is new, not every chunk again."""
        data = self._created.get(key)
        if data is not None:
            return data
        data = self.get_bytes(key)
        if len(data) <= CREATED_CACHE_BYTES // 8:
            with self._created_lock:
                if key not in self._created:
                    self._created[key] = data
                    self._created_bytes += len(data)
                while self._created_bytes > CREATED_CACHE_BYTES:
                    self._created_bytes -= len(self._created.pop(next(iter(self._created))))
        return data

    def has(self, key: str) -> bool:
        """Whether an object is at key (one GET)."""
        try:
            self.store.get(self.key(key))
            return True
        except NotFound:
            return False

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        self.store.put(self.key(key), data, content_type)

    def put_json(self, key: str, body: Any) -> None:
        self.put(key, json.dumps(body, indent=1, default=str).encode(), "application/json")

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> None:
        """Create-only: PreconditionFailed if the key exists (the first writer wins)."""
        self.store.put_if_absent(self.key(key), data, content_type, tags=tags)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> None:
        """Compare-and-swap: PreconditionFailed unless the object is still at `version` (get_object's)."""
        self.store.put_if_match(self.key(key), data, version, content_type)

    def delete(self, key: str) -> None:
        self.store.delete(self.key(key))

    def listing(self, prefix: str, page_size: int = 1000) -> Iterator[tuple[str, datetime, int]]:
        for info in self.store.list(self.key(prefix), page_size):
            yield self._unroot(info.key), info.last_modified, info.size

    def entries(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every key under prefix as listed, with its version token: a rewrite of the same size in the same second
        (S3's LastModified has whole seconds) still shows as a new version."""
        for info in self.store.list(self.key(prefix)):
            yield ObjectInfo(self._unroot(info.key), info.last_modified, info.size, info.version)

    def folders(self, prefix: str) -> Iterator[str]:
        """The folders right under prefix, from a delimiter listing (one entry each, whatever they hold)."""
        for folder in self.store.folders(self.key(prefix)):
            yield self._unroot(folder)

    def location(self, key: str) -> tuple[ObjectStore, str]:
        """The store and the full key (or prefix) of `key`, for code that moves files itself in parts and in
        parallel (checkpoint and artifact sync, code and bundle downloads)."""
        return self.store, self.key(key)

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(HTTP method, URL) a VM uses to read or write `key` without an SDK (see VmUrls)."""
        if not isinstance(self.store, VmUrls):
            raise RuntimeError(f"{type(self.store).__name__} cannot give VMs URLs to the agent bundle")
        return self.store.vm_request(self.key(key), write=write, expires=expires)

    @property
    def vm_auth(self) -> str | None:
        """How a VM authenticates the vm_request URLs: None when they are presigned (VmUrls.vm_auth)."""
        return self.store.vm_auth if isinstance(self.store, VmUrls) else None

    @property
    def bucket(self) -> str | None:
        """The bucket's name, when the store knows it."""
        bucket = getattr(self.store, "bucket", None)
        return bucket if isinstance(bucket, str) and bucket else None

    @property
    def sdk_client(self) -> Any:
        """The store's cloud SDK client, if it has one (to count the API calls an invocation makes)."""
        return getattr(self.store, "client", None)
