"""Checkpoints and artifacts in the bucket that are never torn.

The convention for training code (also in the README):
- Publish a checkpoint by renaming it into place: write `ckpt-100.pt.tmp`, then `os.replace` it to
  `ckpt-100.pt`. A path with a component ending in `.tmp` or containing `.tmp.` (numpy's
  `.ckpt-100.tmp.npz`, a directory `step-100.tmp/`) is never uploaded.
- A file is uploaded once it is unchanged across two scans SETTLE seconds apart, and only if it did not
  change while it was uploaded; a file renamed into place is complete and stays unchanged, so the next sync
  takes it. A file written in place by a writer that pauses longer than SETTLE mid-file can look finished:
  publish such files by rename.
- When the training process has ended, the final sync uploads what it left, newest first, within the Spot
  notice window. If the process died by a signal (it did not exit by itself on SIGTERM), files modified in
  its last SETTLE seconds are left out, since they may be half-written, and the previous complete version of
  each stays in force: to have a checkpoint saved on SIGTERM uploaded, save it and then exit.

Each sync uploads the complete files that are new or changed to fresh keys, then writes a manifest
(create-only, numbered) naming every file of the directory with its key, size and version, and only then
deletes the objects no longer named (old versions, files deleted locally): superseded manifests first, then
the files. A sync cut short leaves the previous manifest in force.

Two lives of one rank can overlap (a rerun starts attempt n+1 while a rank of attempt n still runs its final
sync): file keys carry the attempt, so they never collide, and a life deletes nothing while a manifest it did
not write and had not seen at its restore exists (another life is writing); an earlier life's leftovers are
deleted only when they are older than LEFTOVER_AGE, when that life is surely gone.

Restore reads the newest manifest of each rank and downloads exactly its files,
verifying size and version: a file deleted locally is not in the manifest and never comes back. Every node
receives the union of the ranks' manifests (rank 0's copy wins where two ranks wrote the same path), the
way SageMaker copies the whole checkpoint prefix to every instance.

Under a job's checkpoints/ prefix:
  manifests/<rank>/<seq>.json   {"seq", "rank", "attempt", "written_at", "files": {path: {key, size, version}}}
  files/<rank>/<seq>-a<attempt>/<path>  bytes uploaded by sync <seq> of attempt <attempt>; never overwritten,
                                deleted once unreferenced
Artifacts (SM_MODEL_DIR, output/data) are uploaded once, after the process ends, by the same rules to
<prefix><path> (the directory's mirror), followed by <prefix without "/">.manifest.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from jobplane.agent.transfer import (
    Moved,
    Stat,
    parallel,
    retried,
    safe_path,
    scan,
    stat_of,
    workers,
)
from jobplane.clouds.base import NotFound, ObjectStore, PreconditionFailed

log = logging.getLogger("jobplane.agent")

SETTLE = 2.0  # seconds between the two scans that must agree before a file is uploaded
_MANIFEST_TIME = 3.0  # of a deadline, kept back for writing the manifest after the uploads
_SEQ = re.compile(r"manifests/(\d+)/(\d+)\.json$")
LEFTOVER_AGE = timedelta(hours=2)  # longer than any overlap of two lives (a stop grace is at most 1 h)


def ignored(name: str) -> bool:
    """A file or directory name that is never uploaded: work in progress by the naming convention."""
    return name.endswith(".tmp") or ".tmp." in name


@dataclass(frozen=True)
class Entry:
    """One file of a manifest: its object (relative to the area's prefix), size and version."""

    key: str
    size: int
    version: str


class _Changed(Exception):
    """The file changed while it was uploaded: that copy may be torn, so it is not used."""


def complete(local: Path, settle: float, *, final: bool = False, cut_ns: int | None = None,
             stop: threading.Event | None = None) -> tuple[dict[str, Stat], set[str]]:
    """(files complete enough to upload, every file present).

    Periodic: unchanged across two scans `settle` apart. Final (the process has ended): everything, except
    files modified at or after cut_ns (set when the process died by a signal)."""
    first = scan(local, ignored)
    if final:
        return {rel: st for rel, st in first.items() if cut_ns is None or st[1] < cut_ns}, set(first)
    if stop is not None:
        stop.wait(settle)
    else:
        time.sleep(settle)
    second = scan(local, ignored)
    return {rel: st for rel, st in second.items() if first.get(rel) == st}, set(second)


def upload(store: ObjectStore, local: Path, files: dict[str, Stat], key_of: Callable[[str], str],
           deadline: float | None = None) -> tuple[dict[str, Entry], Moved]:
    """Upload files (newest first, in parallel); an entry per file uploaded whole and unchanged meanwhile."""
    started = time.monotonic()

    def one(rel: str) -> Entry:
        path = local / rel
        version = retried(f"upload {rel}", lambda: store.upload_file(key_of(rel), path))
        if stat_of(path) != files[rel]:
            raise _Changed(rel)
        return Entry(key_of(rel), files[rel][0], version)

    newest_first = sorted(files, key=lambda rel: files[rel][1], reverse=True)
    entries, errors = parallel(((rel, partial(one, rel)) for rel in newest_first), workers(store), deadline)
    for rel, exc in errors.items():
        if isinstance(exc, _Changed):
            log.info("%s changed while it was uploaded: the next sync takes it", rel)
        else:
            log.warning("upload of %s failed: %s", rel, exc)
    moved = Moved(files=len(entries), bytes=sum(e.size for e in entries.values()),
                  seconds=time.monotonic() - started, failed=sorted(errors))
    moved.skipped = len(files) - len(entries) - len(errors)  # not started before the deadline
    return entries, moved


class CheckpointSync:
    """One rank's checkpoint directory and its manifests under `prefix` (the job's checkpoints/ area)."""

    def __init__(self, store: ObjectStore, local: Path, prefix: str, *, rank: int = 0, attempt: int = 0,
                 settle: float = SETTLE, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.clock = clock  # the store's time, for the age of an earlier life's leftovers
        self.store, self.local, self.prefix = store, local, prefix
        self.rank, self.attempt, self.settle = rank, attempt, settle
        self.seq = 0  # of this rank's newest manifest
        self._mine: dict[str, tuple[Stat, Entry]] = {}  # in the manifest, and the local state it was taken from
        self._theirs: dict[str, Stat] = {}  # restored from another rank's manifest, unchanged since
        self._named: dict[str, Entry] = {}  # what this rank's newest manifest names
        self._unnamed: set[str] = set()  # this rank's objects the newest manifest may not name: deleted after it
        self._known: set[str] = set()  # manifests this life wrote or saw at its restore: any other is another life's
        self._ages: dict[str, datetime] = {}  # LastModified of what the restore listed
        self._lock = threading.Lock()  # the periodic and the final sync may overlap

    def _key(self, rel_key: str) -> str:
        return self.prefix + rel_key

    # ---- restore ------------------------------------------------------------------------------------------
    def newest_manifests(self) -> dict[int, tuple[int, str]]:
        """rank -> (seq, key) of each rank's newest manifest."""
        newest: dict[int, tuple[int, str]] = {}
        for info in self.store.list(self.prefix + "manifests/"):
            if (m := _SEQ.search(info.key)) is not None:
                rank, seq = int(m[1]), int(m[2])
                newest[rank] = max(newest.get(rank, (0, "")), (seq, info.key))
        return newest

    def restore(self) -> Moved:
        """Download the union of every rank's newest manifest into the local directory."""
        chosen: dict[str, tuple[int, Entry]] = {}
        for rank, (seq, key) in sorted(self.newest_manifests().items(), reverse=True):  # rank 0 last: it wins
            body = json.loads(self.store.get(key).data)
            files = {rel: Entry(**fields) for rel, fields in body["files"].items()}
            if rank == self.rank:
                self.seq, self._named = seq, files
            chosen.update({rel: (rank, entry) for rel, entry in files.items()})
        started = time.monotonic()
        # what an earlier life of this rank left unnamed (a sync cut short): deleted after the next manifest, if
        # that life is surely gone (its objects are much older than the newest); a recent one may still sync
        listed = [info for area in (f"files/{self.rank}/", f"manifests/{self.rank}/")
                  for info in self.store.list(self._key(area))]
        self._known = {info.key for info in listed if "/manifests/" in info.key}
        self._ages = {info.key: info.last_modified for info in listed}
        self._unnamed |= {info.key for info in listed if info.last_modified < self.clock() - LEFTOVER_AGE}

        def one(rel: str, entry: Entry) -> int:
            path = safe_path(self.local, rel)
            retried(f"restore {rel}", lambda: self.store.download_file(
                self._key(entry.key), path, version=entry.version, size=entry.size))
            if path.stat().st_size != entry.size:
                raise RuntimeError(f"restored {rel} has {path.stat().st_size} bytes, its manifest says {entry.size}")
            return entry.size

        done, errors = parallel(((rel, partial(one, rel, entry)) for rel, (_, entry) in chosen.items()),
                                workers(self.store))
        if errors:
            rel, exc = next(iter(errors.items()))
            raise RuntimeError(f"restoring {len(errors)} checkpoint files failed, e.g. {rel}: {exc}") from exc
        for rel, (rank, entry) in chosen.items():
            st = stat_of(self.local / rel)
            assert st is not None
            if rank == self.rank:
                self._mine[rel] = (st, entry)
            else:
                self._theirs[rel] = st
        return Moved(files=len(done), bytes=sum(done.values()), seconds=time.monotonic() - started)

    # ---- sync ---------------------------------------------------------------------------------------------
    def sync(self, *, final: bool = False, cut_ns: int | None = None, deadline: float | None = None,
             stop: threading.Event | None = None) -> Moved:
        """Upload what is complete and changed, then write a manifest if the directory's content changed.

        final: the process has ended (one scan; cut_ns excludes files modified at or after it). deadline
        (time.monotonic()): no upload starts after it less the manifest's share. stop: a periodic sync
        asked to end early (the final sync is about to run)."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return Moved()
        try:
            return self._sync(final, cut_ns, deadline, stop)
        finally:
            self._lock.release()

    def _sync(self, final: bool, cut_ns: int | None, deadline: float | None,
              stop: threading.Event | None) -> Moved:
        ready, present = complete(self.local, self.settle, final=final, cut_ns=cut_ns, stop=stop)
        changed = {rel: st for rel, st in ready.items()
                   if self._theirs.get(rel) != st and (rel not in self._mine or self._mine[rel][0] != st)}
        seq = self.seq + 1
        if stop is not None and stop.is_set() and not final:
            changed = {}  # the final sync takes over; do not start uploads it would wait for

        def key_of(rel: str) -> str:
            return self._key(f"files/{self.rank}/{seq:08d}-a{self.attempt}/{rel}")

        self._unnamed |= {key_of(rel) for rel in changed}  # an upload discarded or cut short leaves an object
        entries, moved = upload(self.store, self.local, changed, key_of,
                                None if deadline is None else deadline - _MANIFEST_TIME)
        for rel, entry in entries.items():
            self._mine[rel] = (changed[rel], Entry(entry.key.removeprefix(self.prefix), entry.size, entry.version))
            self._theirs.pop(rel, None)
        # a file deleted locally leaves the manifest; one present but incomplete keeps its last complete copy
        self._mine = {rel: kept for rel, kept in self._mine.items() if rel in present}
        self._theirs = {rel: st for rel, st in self._theirs.items() if rel in present}
        files = {rel: entry for rel, (_, entry) in self._mine.items()}
        if files != self._named:
            self._write_manifest(seq, files)
            if deadline is None or time.monotonic() < deadline:
                self._clean()
        return moved

    def _manifest_key(self, seq: int) -> str:
        return self._key(f"manifests/{self.rank}/{seq:08d}.json")

    def _write_manifest(self, seq: int, files: dict[str, Entry]) -> None:
        self._unnamed |= {self._key(entry.key) for entry in self._named.values()}
        if self.seq:
            self._unnamed.add(self._manifest_key(self.seq))
        while True:
            body = {"seq": seq, "rank": self.rank, "attempt": self.attempt,
                    "written_at": datetime.now(UTC).isoformat(),
                    "files": {rel: asdict(entry) for rel, entry in sorted(files.items())}}
            key, data = self._manifest_key(seq), json.dumps(body, indent=1).encode()
            try:
                self._known.add(key)
                retried(f"manifest {seq}", partial(self.store.put_if_absent, key, data))
                break
            except PreconditionFailed:  # another life got there first (never overwrite it), or our own write
                with contextlib.suppress(NotFound):  # landed and its response was lost: the resend found it
                    if retried(f"manifest {seq} check", partial(self.store.get, key)).data == data:
                        break
                seq += 1
        self.seq, self._named = seq, files

    def _clean(self) -> None:
        """Delete this rank's objects the newest manifest does not name (old versions, deleted files, older
        manifests), known without listing the bucket; a failed delete is tried again after the next manifest."""
        self._unnamed -= {self._key(entry.key) for entry in self._named.values()} | {self._manifest_key(self.seq)}
        if not self._unnamed:
            return
        others = {info.key for info in self.store.list(self._key(f"manifests/{self.rank}/"))} - self._known
        if others:  # another life of this rank is writing: what it names is not ours to judge
            log.warning("another life of rank %d wrote %s: not deleting old checkpoint objects", self.rank,
                        sorted(others)[-1])
            return
        # another life's files (an earlier attempt's, still named by a manifest it may write again on its final
        # sync) go only once old: until then they are leftovers a later life collects
        recent = self.clock() - LEFTOVER_AGE
        self._unnamed -= {k for k in self._unnamed if "/files/" in k and f"-a{self.attempt}/" not in k
                          and self._ages.get(k, recent) >= recent}
        manifests = {k for k in self._unnamed if "/manifests/" in k}
        _, errors = parallel(((key, partial(self.store.delete, key)) for key in sorted(manifests)), workers(self.store))
        if not errors:  # a file goes only once no manifest that may name it is left
            _, errors = parallel(((key, partial(self.store.delete, key)) for key in sorted(self._unnamed - manifests)),
                                 workers(self.store))
            self._unnamed = set()
        self._unnamed = (self._unnamed - manifests) | set(errors)
        if errors:
            log.warning("deleting %d old checkpoint objects failed (tried again later): %s", len(errors),
                        next(iter(errors.values())))


def publish(store: ObjectStore, local: Path, prefix: str, *, cut_ns: int | None = None,
            deadline: float | None = None) -> Moved:
    """Upload a finished directory (artifacts) to prefix<path>, then prefix.manifest.json; delete objects
    under prefix the manifest does not name (an earlier attempt's). Raises if any file failed."""
    ready, _ = complete(local, 0.0, final=True, cut_ns=cut_ns)
    entries, moved = upload(store, local, ready, lambda rel: prefix + rel, deadline)
    if moved.failed:
        raise RuntimeError(f"uploading {len(moved.failed)} files of {local} failed, e.g. {moved.failed[0]}")
    files = {rel: asdict(Entry(rel, e.size, e.version)) for rel, e in sorted(entries.items())}
    manifest = {"written_at": datetime.now(UTC).isoformat(), "files": files}
    retried("artifacts manifest", lambda: store.put(prefix.rstrip("/") + ".manifest.json",
                                                    json.dumps(manifest, indent=1).encode(), "application/json"))
    keep = {prefix + rel for rel in entries}
    stale = [info.key for info in store.list(prefix) if info.key not in keep]
    _, errors = parallel(((key, partial(store.delete, key)) for key in stale), workers(store))
    if errors:  # the manifest already says what is current
        log.warning("deleting %d stale objects under %s failed: %s", len(errors), prefix, next(iter(errors.values())))
    return moved
