"""Moving files between the VM and object storage: code bundles, inputs, checkpoints, artifacts.

Works on any ObjectStore with full keys (the caller applies the registry root). Whole objects go
through memory (the ObjectStore protocol has no streaming); fine for code, logs and checkpoints of
modest size.
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path, PurePosixPath

from jobplane.agent.layout import relative_key
from jobplane.clouds.base import ObjectStore

TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def keys_under(store: ObjectStore, prefix: str) -> list[str]:
    """Keys of the object `prefix` itself or anything in the "folder" prefix/ (never prefix2/...)."""
    if not prefix or prefix.endswith("/"):
        return [info.key for info in store.list(prefix) if not info.key.endswith("/")]
    return [info.key for info in store.list(prefix)
            if info.key == prefix or info.key.startswith(prefix + "/")]


def safe_path(dest: Path, rel: str) -> Path:
    """dest/rel, refusing keys that would escape dest (.., absolute)."""
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts or PurePosixPath(rel).is_absolute():
        raise ValueError(f"refusing to write object {rel!r} outside {dest}")
    return dest.joinpath(*parts)


def download(store: ObjectStore, keys: list[str], prefix: str, dest: Path) -> int:
    """Write each key to dest/<key relative to prefix>; returns the bytes written."""
    total = 0
    for key in keys:
        path = safe_path(dest, relative_key(key, prefix))
        path.parent.mkdir(parents=True, exist_ok=True)
        data = store.get(key).data
        path.write_bytes(data)
        total += len(data)
    return total


def unpack(data: bytes, dest: Path) -> None:
    """Unpack a (gzipped) tarball; the "data" filter refuses links out, absolute paths and devices. Pythons
    before 3.11.4 (Debian 12 has 3.11.2) have no filters: there the same refusals are checked first."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        for member in tar.getmembers():
            target = (root / member.name).resolve()
            link = (target.parent / member.linkname).resolve() if member.issym() or member.islnk() else target
            if member.isdev() or not target.is_relative_to(root) or not link.is_relative_to(root):
                raise tarfile.TarError(f"{member.name!r} would land outside {dest} or is a device: refused")
        tar.extractall(dest)  # checked above


class DirSync:
    """Uploads the files of a local directory under a key prefix, each only when it changed
    (size or mtime) since the last upload or since it was downloaded."""

    def __init__(self, store: ObjectStore, local: Path, prefix: str) -> None:
        self.store, self.local, self.prefix = store, local, prefix
        self._seen: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()  # the periodic and the final sync may overlap

    def _scan(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        if not self.local.is_dir():
            return found
        for root, _, files in os.walk(self.local):
            for name in files:
                path = Path(root, name)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue  # deleted while we walked
                found[path.relative_to(self.local).as_posix()] = (st.st_size, st.st_mtime_ns)
        return found

    def mark_synced(self) -> None:
        """Treat what is on disk now as already uploaded (after downloading it from the same prefix)."""
        self._seen = self._scan()

    def sync(self) -> int:
        """Upload changed files; returns how many. A failed upload stays pending for the next sync."""
        with self._lock:
            return self._sync()

    def _sync(self) -> int:
        uploaded = 0
        for rel, state in sorted(self._scan().items()):
            if self._seen.get(rel) == state:
                continue
            try:
                data = (self.local / rel).read_bytes()
            except FileNotFoundError:
                continue
            self.store.put(self.prefix + rel, data)
            self._seen[rel] = state
            uploaded += 1
        return uploaded
