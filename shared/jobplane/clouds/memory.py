"""In-memory ObjectStore with the same conditional-write semantics as S3 and GCS (for pure unit tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

from jobplane.clouds.base import Blob, NotFound, ObjectInfo, PreconditionFailed


class MemoryStore:
    """Thread-safe dict of key -> Blob; versions are a global counter, like GCS generations."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._objects: dict[str, Blob] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._clock = clock or (lambda: datetime.now(UTC))
        self.calls: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def _write(self, key: str, data: bytes) -> str:
        self._counter += 1
        version = str(self._counter)
        self._objects[key] = Blob(data=bytes(data), version=version, last_modified=self._clock())
        return version

    def get(self, key: str) -> Blob:
        with self._lock:
            self._count("get")
            try:
                return self._objects[key]
            except KeyError:
                raise NotFound(key) from None

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        with self._lock:
            self._count("put")
            return self._write(key, data)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        with self._lock:
            self._count("put")
            if key in self._objects:
                raise PreconditionFailed(f"{key} exists")
            return self._write(key, data)  # tags only feed cloud lifecycle rules: none here

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        with self._lock:
            self._count("put")
            current = self._objects.get(key)
            if current is None or current.version != version:
                raise PreconditionFailed(f"{key} changed")
            return self._write(key, data)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        start = ""
        while True:
            with self._lock:
                self._count("list")
                keys = sorted(k for k in self._objects if k.startswith(prefix) and k > start)[:page_size]
                page = [
                    ObjectInfo(key=k, last_modified=self._objects[k].last_modified, size=len(self._objects[k].data))
                    for k in keys
                ]
            yield from page
            if len(page) < page_size:
                return
            start = page[-1].key

    def delete(self, key: str) -> None:
        with self._lock:
            self._count("delete")
            self._objects.pop(key, None)
