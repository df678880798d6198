"""In-memory ObjectStore with the same conditional-write semantics as S3 and GCS (for pure unit tests).

Objects are kept as the parts they arrived in: upload_file reads a file part by part and download_file
writes it back the same way, so a transfer never holds more than one part beyond what the store keeps, as
the cloud stores' streaming transfers do.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jobplane.clouds.base import Blob, NotFound, ObjectInfo, PreconditionFailed, Progress, TransferLimits
from jobplane.clouds.streams import atomic_file, read_parts


@dataclass(frozen=True)
class _Stored:
    parts: tuple[bytes, ...]
    version: str
    last_modified: datetime

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


class MemoryStore:
    """Thread-safe dict of key -> object; versions are a global counter, like GCS generations."""

    def __init__(self, clock: Callable[[], datetime] | None = None, limits: TransferLimits | None = None) -> None:
        self._objects: dict[str, _Stored] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._clock = clock or (lambda: datetime.now(UTC))
        self.limits = limits or TransferLimits()
        self.calls: dict[str, int] = {}
        self.served: dict[str, builtins.list[int]] = {}  # key -> sizes of the pieces download_file wrote

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def _write(self, key: str, parts: tuple[bytes, ...]) -> str:
        self._counter += 1
        version = str(self._counter)
        self._objects[key] = _Stored(parts, version, self._clock())
        return version

    def get(self, key: str) -> Blob:
        with self._lock:
            self._count("get")
            try:
                obj = self._objects[key]
            except KeyError:
                raise NotFound(key) from None
        data = obj.parts[0] if len(obj.parts) == 1 else b"".join(obj.parts)
        return Blob(data=data, version=obj.version, last_modified=obj.last_modified)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        with self._lock:
            self._count("put")
            return self._write(key, (bytes(data),))

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        with self._lock:
            self._count("put")
            if key in self._objects:
                raise PreconditionFailed(f"{key} exists")
            return self._write(key, (bytes(data),))  # tags only feed cloud lifecycle rules: none here

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        with self._lock:
            self._count("put")
            current = self._objects.get(key)
            if current is None or current.version != version:
                raise PreconditionFailed(f"{key} changed")
            return self._write(key, (bytes(data),))

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        start = ""
        while True:
            with self._lock:
                self._count("list")
                keys = sorted(k for k in self._objects if k.startswith(prefix) and k > start)[:page_size]
                page = [ObjectInfo(key=k, last_modified=self._objects[k].last_modified, size=self._objects[k].size,
                                   version=self._objects[k].version) for k in keys]
            yield from page
            if len(page) < page_size:
                return
            start = page[-1].key

    def delete(self, key: str) -> None:
        with self._lock:
            self._count("delete")
            self._objects.pop(key, None)

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        parts = []
        for part in read_parts(path, self.limits.part_size):
            parts.append(part)
            if progress:
                progress(len(part))
        with self._lock:
            self._count("upload_file")
            return self._write(key, tuple(parts))

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        with self._lock:
            self._count("download_file")
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound(key)
        if version is not None and obj.version != version:
            raise PreconditionFailed(f"{key} is at version {obj.version}, not {version}")
        step = self.limits.part_size
        with atomic_file(path) as tmp, tmp.open("wb") as out:
            for part in obj.parts:
                view = memoryview(part)  # slices of a view copy nothing: one part at a time, as on a cloud
                for start in range(0, len(view), step):
                    piece = view[start:start + step]
                    out.write(piece)
                    self.served.setdefault(key, []).append(len(piece))
                    if progress:
                        progress(len(piece))
        return obj.version

    def parts(self, key: str) -> builtins.list[int]:
        """The sizes of the parts an object arrived in (tests check that large files move in parts)."""
        with self._lock:
            return [len(p) for p in self._objects[key].parts]
