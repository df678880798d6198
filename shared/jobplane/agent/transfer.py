"""Moving files between the VM and object storage: code bundles, input channels, and the parallel uploads
checkpoints and artifacts are made of.

Works on any ObjectStore with full keys (the caller applies the registry root). Every file is streamed by
the store (ObjectStore.upload_file / download_file: parts, parallel, retried), so memory stays bounded
whatever the file's size; many files move in parallel on a thread pool, or, for an input channel's downloads,
as one ObjectStore.download_files batch (the agent's S3 store sends it through awscrt with no thread waiting on
each file). A download appears under its final name only once complete.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TypeVar

from jobplane.agent.layout import relative_key
from jobplane.clouds.base import FileGet, NotFound, ObjectInfo, ObjectStore, PreconditionFailed

log = logging.getLogger("jobplane.agent")
T = TypeVar("T")

Sleep = Callable[[float], None]  # the agent's clock's sleep: a retry's pause
FILE_TRIES = 3  # per file, on top of the SDK's retries of each request


def keys_under(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    """Objects named `prefix` itself or anything in the "folder" prefix/ (never prefix2/...)."""
    if not prefix or prefix.endswith("/"):
        return [info for info in store.list(prefix) if not info.key.endswith("/")]
    return [info for info in store.list(prefix) if info.key == prefix or info.key.startswith(prefix + "/")]


def safe_path(dest: Path, rel: str) -> Path:
    """dest/rel, refusing keys that would escape dest (.., absolute)."""
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts or PurePosixPath(rel).is_absolute():
        raise ValueError(f"refusing to write object {rel!r} outside {dest}")
    return dest.joinpath(*parts)


def workers(store: ObjectStore) -> int:
    """Files in flight at once: small files are latency-bound, so more than the store's part concurrency."""
    return store.limits.files_in_flight


def retried(what: str, fn: Callable[[], T], tries: int = FILE_TRIES, *, sleep: Sleep = time.sleep) -> T:
    """fn(), tried again on errors a retry can fix (not a missing object or a changed version, nor a local file
    gone: a checkpoint the job deleted during its upload)."""
    for attempt in range(1, tries + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == tries or not _retryable(exc):
                raise
            log.warning("%s failed (try %d of %d): %s", what, attempt, tries, exc)
            sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def downloaded(store: ObjectStore, gets: list[FileGet], tries: int = FILE_TRIES, *,
               sleep: Sleep = time.sleep) -> list[str | Exception]:
    """store.download_files(gets), the failures a retry can fix tried again as retried() would; per file, in
    order, its version or its last error."""
    outcomes = store.download_files(gets)
    for attempt in range(1, tries):
        again = [n for n, got in enumerate(outcomes) if isinstance(got, Exception) and _retryable(got)]
        if not again:
            break
        first = outcomes[again[0]]
        log.warning("%d downloads failed (try %d of %d), e.g. %s: %s", len(again), attempt, tries,
                    gets[again[0]].key, first)
        sleep(0.5 * attempt)
        for n, got in zip(again, store.download_files([gets[n] for n in again]), strict=True):
            outcomes[n] = got
    return outcomes


def _retryable(exc: Exception) -> bool:
    return not isinstance(exc, NotFound | PreconditionFailed | ValueError | FileNotFoundError)


@dataclass
class Moved:
    """What a batch of transfers did; `seconds` is wall time for the batch."""

    files: int = 0
    bytes: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)

    def add(self, other: Moved) -> None:
        """Another batch's files, bytes and time (its failures are the caller's to merge)."""
        self.files, self.bytes, self.seconds = self.files + other.files, self.bytes + other.bytes, \
            self.seconds + other.seconds
        self.skipped += other.skipped

    def summary(self) -> str:
        rate = self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        skipped = f", {self.skipped} already present" if self.skipped else ""
        return f"{self.files} files{skipped}, {self.bytes} bytes in {self.seconds:.1f} s ({rate:.1f} MB/s)"


def parallel(jobs: Iterable[tuple[str, Callable[[], T]]], threads: int, deadline: float | None = None,
             ) -> tuple[dict[str, T], dict[str, BaseException]]:
    """Run named jobs on a thread pool in the order given (at most `threads` at once); return results and
    errors by name. With a deadline (time.monotonic()), no job starts after it and unfinished ones are
    abandoned to their threads, so a caller racing a Spot notice returns on time."""
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    jobs = list(jobs)
    if len(jobs) <= 1 and deadline is None:  # no pool for one job: most syncs move a file or two
        for name, fn in jobs:
            try:
                if (one := fn()) is not None:
                    results[name] = one
            except Exception as failed:
                errors[name] = failed
        return results, errors
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="transfer")

    def guarded(fn: Callable[[], T]) -> Callable[[], T | None]:
        def run() -> T | None:
            if deadline is not None and time.monotonic() >= deadline:
                return None  # too late to start: the caller has moved on
            return fn()
        return run

    names: dict[Future[T | None], str] = {pool.submit(guarded(fn)): name for name, fn in jobs}
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        for future in as_completed(names, timeout=timeout):  # one waiter for all: linear in the number of jobs
            if (exc := future.exception()) is not None:
                errors[names[future]] = exc
            elif (value := future.result()) is not None:
                results[names[future]] = value
    except TimeoutError:
        pass  # the deadline passed with transfers still running: leave them to their threads
    finally:
        pool.shutdown(wait=deadline is None, cancel_futures=True)
    return results, errors


# ---- downloads -------------------------------------------------------------------------------------------
def fetch(store: ObjectStore, objects: list[ObjectInfo], prefix: str, dest: Path,
          state_file: Path | None = None, *, sleep: Sleep = time.sleep) -> Moved:
    """Download objects into dest/<key relative to prefix>, in parallel.

    With a state file (one per channel), a file already present with the size and version it was downloaded
    with, and not modified since, is not fetched again: a retried or rerun download resumes where it was."""
    started = time.monotonic()
    state: dict[str, list[int | str]] = _load_state(state_file)
    moved, todo = Moved(), []
    for info in objects:
        path = safe_path(dest, relative_key(info.key, prefix))
        rel = path.relative_to(dest).as_posix()
        if _still_there(path, state.get(rel), info):
            moved.skipped += 1
        else:
            state.pop(rel, None)
            todo.append((rel, info, path))

    try:
        gets = [FileGet(info.key, path, info.version or None, info.size) for _, info, path in todo]
        outcomes = downloaded(store, gets, sleep=sleep)
        results = {rel: (info.size, got) for (rel, info, _), got in zip(todo, outcomes, strict=True)
                   if isinstance(got, str)}
        errors = {rel: got for (rel, _, _), got in zip(todo, outcomes, strict=True) if isinstance(got, Exception)}
        for rel, (size, version) in results.items():
            st = (dest / rel).stat()
            state[rel] = [size, version, st.st_mtime_ns]
            moved.files += 1
            moved.bytes += size
        moved.failed = sorted(errors)
        if errors:
            first = next(iter(errors.values()))
            raise RuntimeError(f"{len(errors)} of {len(todo)} downloads into {dest} failed, e.g. "
                               f"{moved.failed[0]}: {first}") from first
    finally:
        _save_state(state_file, state)
        moved.seconds = time.monotonic() - started
    return moved


def _still_there(path: Path, known: list[int | str] | None, info: ObjectInfo) -> bool:
    if known is None or not info.version or known[:2] != [info.size, info.version]:
        return False
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return st.st_size == info.size and st.st_mtime_ns == known[2]


def _load_state(path: Path | None) -> dict[str, list[int | str]]:
    if path is None:
        return {}
    try:
        loaded = json.loads(path.read_text())
        return loaded if isinstance(loaded, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def _save_state(path: Path | None, state: dict[str, list[int | str]]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def fetch_tarball(store: ObjectStore, key: str, dest: Path, *, sleep: Sleep = time.sleep) -> int:
    """Stream a (gzipped) tarball to a temporary file and unpack it; returns its size in bytes."""
    with tempfile.TemporaryDirectory(prefix="jobplane-bundle-") as tmp:
        local = Path(tmp) / "bundle"
        retried(f"download {key}", lambda: store.download_file(key, local), sleep=sleep)
        unpack(local, dest)
        return local.stat().st_size


def unpack(tarball: Path, dest: Path) -> None:
    """Unpack a (gzipped) tarball; the "data" filter refuses links out, absolute paths and devices. Pythons
    before 3.11.4 (Debian 12 has 3.11.2) have no filters: there the same refusals are checked first."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, mode="r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        # one member at a time, each checked against what is on disk by then: a symlink an earlier member
        # made (a -> ., then a/b -> ..) must count when a later one (a/b/x) is resolved
        for member in tar.getmembers():
            target = (root / member.name).resolve()
            if member.issym():
                link = (target.parent / member.linkname).resolve()
            elif member.islnk():  # a hard link's name is relative to the archive's root
                link = (root / member.linkname).resolve()
            else:
                link = target
            if member.isdev() or not target.is_relative_to(root) or not link.is_relative_to(root):
                raise tarfile.TarError(f"{member.name!r} would land outside {dest} or is a device: refused")
            tar.extract(member, dest)  # checked just above, against the tree as extracted so far


# ---- local files ------------------------------------------------------------------------------------------
Stat = tuple[int, int, int]  # size, mtime_ns, inode: a rewrite or a rename-over changes at least one


def stat_of(path: Path) -> Stat | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def scan(local: Path, ignored: Callable[[str], bool]) -> dict[str, Stat]:
    """Every regular file under local (relative POSIX path -> Stat), minus the ignored ones."""
    found: dict[str, Stat] = {}
    if not local.is_dir():
        return found
    for root, dirs, files in os.walk(local):
        base = Path(root)
        dirs[:] = [d for d in dirs if not ignored(d)]
        for name in files:
            rel = (base / name).relative_to(local).as_posix()
            if not ignored(name) and (st := stat_of(base / name)) is not None:
                found[rel] = st
    return found
