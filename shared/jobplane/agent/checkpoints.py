"""Checkpoints and artifacts in the bucket that are never torn.

The convention for training code (also in the README):
- Publish a checkpoint by renaming it into place: write `ckpt-100.pt.tmp`, then `os.replace` it to
  `ckpt-100.pt`. A path with a component ending in `.tmp` or containing `.tmp.` (numpy's
  `.ckpt-100.tmp.npz`, a directory `step-100.tmp/`) is never uploaded.
- A file is complete when no process holds it open for writing (the kernel's view, agent/writers.py), and it
  is uploaded only if it did not change while it was uploaded. A file the job writes while it runs (open for
  writing at a look, or rewritten in place between two: a `torch.save` every few seconds) goes up from a whole
  private copy instead, taken the moment a save ends with the job's processes frozen (agent/copies.py): at each
  sync, and every sync interval while an upload runs longer, so the newest whole copy is never more than a save
  cycle and a sync interval old. Where the kernel cannot tell, a file counts as complete once unchanged across
  two scans SETTLE seconds apart. A writer that closes a file mid-way and reopens it to go on can look finished:
  publish such files by rename.
- A save a signal cut looks closed and quiet, and is not whole: a periodic sync takes nothing once SIGKILL is due
  or the job has ended (`live`), nor, before that, a file that was open for writing at a signal and has not
  changed since (`cut`: the SIGTERM may have ended its writer), and no copy is taken of one.
- When the training process has ended, the final sync uploads what it left, newest first, within the Spot
  notice window, except the files its processes held open for writing when the agent stopped them (recorded
  with the processes frozen, just before the signal): those may be half-written, so the newest whole copy of
  each goes up instead if it is newer than the bucket's, else the previous complete version stays in force.
  Where the kernel could not tell, files modified in the last SETTLE seconds before a death by signal are left
  out instead.
- A training library's save of several files (the Trainer's `checkpoint-N/`, DeepSpeed's `global_stepN/` and its
  `latest`, torch.distributed.checkpoint's shards and `.metadata`, Lightning's `epoch=..-step=..`: agent/saves.py)
  goes up and is named as a set, once whole: a half one is never named, while the job runs nor at a stop (its files
  are left out, and the log says which save stays), and the newest whole save of a series stays named while the job
  has a newer one not whole in the bucket yet, even once its rotation deleted the older one locally. A file the job
  deletes during its upload (a rotation: save_total_limit, save_top_k) is a deletion: no retry, no failure.
- Never silently: a file left out, or whose newest version has not reached the bucket for longer than
  `overdue_after`, is reported through `say` (the job's log), naming the file and the rule, once per reason.

Each sync uploads the complete files that are new or changed to fresh keys, then writes a manifest
(create-only, numbered) naming every file of the directory with its key, size and version, and only then
deletes the objects no longer named (old versions, files deleted locally): superseded manifests first, then
the files. A sync cut short leaves the previous manifest in force.

Two lives of one rank can overlap (a rerun starts attempt n+1 while a rank of attempt n still runs its final
sync): file keys carry the attempt, so they never collide, and a life's clean-up never takes what the other
names, in whatever order they interleave:
- a restore announces itself first: it writes its own manifest naming what it restored (the objects it now
  stands on) before it downloads them;
- a life deletes nothing while a manifest it did not write and had not seen at its restore exists (another life
  is writing), nor once the job has moved on to a later attempt (`superseded`: the agent reads job.json; a
  rerun's claim comes before its VMs boot);
- the first manifest after a restore checks that the restored objects it names from an earlier life are still
  in the bucket (a delete that raced the restore), and uploads any that are not again;
- an earlier life's leftovers are deleted only when they are older than LEFTOVER_AGE, when it is surely gone.

Restore reads the newest manifest of each rank whose objects are all in the bucket (one naming a missing object
is passed over, and the log says so) and downloads exactly its files, verifying size and version: a file
deleted locally is not in the manifest and never comes back; nor is a half save an older agent named (the newest of
its series without its library's last file, or short of its predecessor's files): it is said and passed over. Every node
receives the union of the ranks' manifests (rank 0's copy wins where two ranks wrote the same path), the
way SageMaker copies the whole checkpoint prefix to every instance.

Under a job's checkpoints/ prefix:
  manifests/<rank>/<seq>.json   {"seq", "rank", "attempt", "written_at", "step", "files": {path: {key, size,
                                version}}}; step: the training step the job's output last showed, if any
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from jobplane.agent.copies import Copies, Copy, Freezer, unfrozen
from jobplane.agent.saves import LAST, Saves, group, judge, read_pointers, saved_step, stand_in
from jobplane.agent.transfer import (
    Moved,
    Sleep,
    Stat,
    parallel,
    retried,
    safe_path,
    scan,
    stat_of,
    workers,
)
from jobplane.agent.writers import under, writing
from jobplane.clouds.base import NotFound, ObjectInfo, ObjectStore, PreconditionFailed

log = logging.getLogger("jobplane.agent")

SETTLE = 2.0  # where the kernel cannot tell what is open: seconds between two scans that must agree
OPEN = "open for writing by the job at every sync (a file is uploaded once closed)"
EMPTY = "empty at every sync but the last (a file being created or truncated is empty before its writer shows)"
CHANGED = "rewritten while it was uploaded"
CUT = "open for writing when the job's processes were signalled, and unchanged since: it may be half-written"
Writers = Callable[[], set[str] | None]  # absolute paths open for writing now; None: the kernel cannot tell
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


_EPOCH = datetime.min.replace(tzinfo=UTC)


def _when(text: object) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


class _Changed(Exception):
    """The file changed while it was uploaded: that copy may be torn, so it is not used."""


def failed_of(errors: Mapping[str, BaseException], rel: str, late: str) -> str:
    """Why rel's upload did not land: rewritten meanwhile, an error, or never started (late)."""
    exc = errors.get(rel)
    return late if exc is None else CHANGED if isinstance(exc, _Changed) else f"upload failed: {exc}"


class _Gone(Exception):
    """The job deleted the file while it was uploaded (a rotation: save_total_limit, save_top_k): a deletion."""


@dataclass
class Ready:
    """One look at a directory: the files complete enough to upload, every file, and why the others wait."""

    files: dict[str, Stat]
    present: set[str]
    held: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Stat] = field(default_factory=dict)  # every file as scanned


def complete(local: Path, settle: float, *, final: bool = False, leave_out: Mapping[str, str] | None = None,
             cut_ns: int | None = None, writers: Writers = writing, empty_before: frozenset[str] = frozenset(),
             stop: threading.Event | None = None) -> Ready:
    """Periodic: the files no process holds open for writing (scanned first, so one closed after the scan
    changed after it, which the upload notices); where the kernel cannot tell, unchanged across two scans
    `settle` apart. An empty file counts only if it was empty at the previous look too (empty_before): open()
    truncates a file before its descriptor shows in /proc. Final (the process has ended): everything but
    leave_out (relative path -> why) and, if cut_ns is set, files modified at or after it."""
    first = scan(local, ignored)
    if final:
        held = {rel: why for rel, why in (leave_out or {}).items() if rel in first}
        if cut_ns is not None:
            held |= {rel: f"modified in the last {settle:g} s before the process was killed, and the kernel could"
                          " not tell whether it was being written" for rel, st in first.items()
                     if st[1] >= cut_ns and rel not in held}
        return Ready({rel: st for rel, st in first.items() if rel not in held}, set(first), held, first)
    busy = writers()
    if busy is not None:
        held = {rel: EMPTY for rel, st in first.items() if st[0] == 0 and rel not in empty_before}
        held |= dict.fromkeys(under(busy, local) & first.keys(), OPEN)
        return Ready({rel: st for rel, st in first.items() if rel not in held}, set(first), held, first)
    if stop is not None:
        stop.wait(settle)
    else:
        time.sleep(settle)
    second = scan(local, ignored)
    unsettled = f"changed within {settle:g} s at every sync (the kernel cannot tell what is open for writing here)"
    held = {rel: unsettled for rel, st in second.items() if first.get(rel) != st}
    return Ready({rel: st for rel, st in second.items() if rel not in held}, set(second), held, second)


def upload(store: ObjectStore, local: Path, files: dict[str, Stat], key_of: Callable[[str], str],
           deadline: float | None = None, sleep: Sleep = time.sleep, copies: Mapping[str, Copy] | None = None,
           ) -> tuple[dict[str, Entry], Moved, dict[str, BaseException]]:
    """Upload files (newest first, in parallel), each from its copy if `copies` has one, else from the directory;
    an entry per file uploaded whole and unchanged meanwhile, and the error of each file that was not (_Changed:
    rewritten during its upload; _Gone: deleted by the job meanwhile, which no retry can help)."""
    started = time.monotonic()

    def one(rel: str) -> Entry:
        copy = (copies or {}).get(rel)  # a private copy: nothing rewrites it
        path = local / rel if copy is None else copy.path
        try:
            version = retried(f"upload {rel}", lambda: store.upload_file(key_of(rel), path), sleep=sleep)
        except FileNotFoundError:
            if copy is None and stat_of(path) is None:
                raise _Gone(rel) from None
            raise
        if copy is None and (now := stat_of(path)) != files[rel]:
            raise _Gone(rel) if now is None else _Changed(rel)
        return Entry(key_of(rel), files[rel][0], version)

    newest_first = sorted(files, key=lambda rel: files[rel][1], reverse=True)
    entries, errors = parallel(((rel, partial(one, rel)) for rel in newest_first), workers(store), deadline)
    for rel, exc in errors.items():
        if not isinstance(exc, _Changed | _Gone):
            log.warning("upload of %s failed: %s", rel, exc)
    moved = Moved(files=len(entries), bytes=sum(e.size for e in entries.values()), seconds=time.monotonic() - started,
                  failed=sorted(rel for rel, exc in errors.items() if not isinstance(exc, _Gone)))
    moved.skipped = len(files) - len(entries) - len(errors)  # not started before the deadline
    return entries, moved, errors


def age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class CheckpointSync:
    """One rank's checkpoint directory and its manifests under `prefix` (the job's checkpoints/ area)."""

    def __init__(self, store: ObjectStore, local: Path, prefix: str, *, rank: int = 0, attempt: int = 0,
                 settle: float = SETTLE, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 writers: Writers = writing, say: Callable[[str], None] = log.warning,
                 step: Callable[[], int | None] = lambda: None, overdue_after: float | None = None,
                 sleep: Sleep = time.sleep, superseded: Callable[[], bool] = lambda: False,
                 freezer: Freezer = unfrozen, freeze: float = 1.0, copy_every: float | None = None,
                 copy_wait: float = 0.5, live: Callable[[], bool] = lambda: True,
                 cut: Callable[[Path, str, Stat], bool] = lambda local, rel, st: False) -> None:
        self.clock = clock  # the store's time, for the age of an earlier life's leftovers
        self.sleep = sleep  # a retry's pause
        self.store, self.local, self.prefix = store, local, prefix
        self.rank, self.attempt, self.settle = rank, attempt, settle
        self.writers, self.say, self.step, self.overdue_after = writers, say, step, overdue_after
        self.superseded = superseded  # the job has moved on to a later attempt: this life deletes nothing
        self.restored_from: tuple[str, datetime | None] | None = None  # the newest manifest restored, its time
        self._versions: dict[str, tuple[datetime | None, int | None]] = {}  # in the bucket: uploaded when, at step
        self._steps: dict[str, int | None] = {}  # Lightning's last.ckpt in the bucket: its own global_step
        self._stood_in: dict[str, str] = {}  # last.ckpt -> the save named as it at the last sync (saves.stand_in)
        self._waiting: dict[str, tuple[float, str]] = {}  # newest version not in the bucket: since (monotonic), why
        self._told: set[tuple[str, str]] = set()  # (file, why) already said
        self._empty: frozenset[str] = frozenset()  # files empty at the last look
        self.seq = 0  # of this rank's newest manifest
        self._mine: dict[str, tuple[Stat, Entry]] = {}  # in the manifest, and the local state it was taken from
        self._theirs: dict[str, Stat] = {}  # restored from another rank's manifest, unchanged since
        self._named: dict[str, Entry] = {}  # what this rank's newest manifest names
        self._unnamed: set[str] = set()  # this rank's objects the newest manifest may not name: deleted after it
        self._known: set[str] = set()  # manifests this life wrote or saw at its restore: any other is another life's
        self._ages: dict[str, datetime] = {}  # LastModified of what the restore listed
        self._reused: set[str] = set()  # files named as restored from another life's objects, not yet checked
        self._lock = threading.Lock()  # the periodic and the final sync may overlap
        # files written while the job runs go up from whole copies (agent/copies.py), taken at each sync (waiting
        # up to copy_wait seconds for a save to end) and every copy_every seconds while an upload runs longer;
        # live: no SIGKILL of the agent's due and the job not ended; cut(local, rel, stat): that version of the
        # file was open for writing at a signal, so it may be half-written
        self.copies = Copies(local, local.parent / f".{local.name}.staging", freezer=freezer, freeze=freeze,
                             cut=partial(cut, local))
        self.copy_every, self.copy_wait, self.live, self.cut = copy_every, copy_wait, live, cut
        self._closed: dict[str, Stat] = {}  # each file as last seen closed
        self._in_place: set[str] = set()  # files seen written: open at a look, or rewritten in place between two
        self._kept_open: set[str] = set()  # files never seen closed, open throughout a copy's wait: not waited for
        self._in_saves: set[str] = set()  # files of a library's save (agent/saves.py) at the last look: no copies

    def _key(self, rel_key: str) -> str:
        return self.prefix + rel_key

    # ---- restore ------------------------------------------------------------------------------------------
    def _whole_manifests(self, listed: list[ObjectInfo], present: set[str]) -> dict[int, tuple[int, str, Any]]:
        """rank -> (seq, key, body) of each rank's newest manifest whose objects are all in the bucket. One that
        names a missing object (a life's delete raced another's manifest) is passed over for the one before."""
        by_rank: dict[int, list[tuple[int, str]]] = {}
        for info in listed:
            if (m := _SEQ.search(info.key)) is not None:
                by_rank.setdefault(int(m[1]), []).append((int(m[2]), info.key))
        whole: dict[int, tuple[int, str, Any]] = {}
        for rank, found in by_rank.items():
            for seq, key in sorted(found, reverse=True):
                try:
                    body = json.loads(self.store.get(key).data)
                except NotFound:  # deleted since the listing: superseded
                    continue
                gone = sorted(rel for rel, entry in body["files"].items() if self._key(entry["key"]) not in present)
                if not gone:
                    whole[rank] = (seq, key, body)
                    break
                self.say(f"checkpoint manifest {rank}/{seq:08d} names {len(gone)} missing objects (e.g. {gone[0]}):"
                         " restoring the one before it")
        return whole

    def _reset(self) -> None:
        """Forget what an earlier try of restore learned."""
        self.restored_from, self.seq = None, 0
        self._versions, self._mine, self._theirs, self._named, self._closed = {}, {}, {}, {}, {}
        self._steps, self._stood_in = {}, {}
        self._known, self._ages, self._reused = set(), {}, set()

    def restore(self, *, announce: bool = True) -> Moved:
        """Download the union of every rank's newest whole manifest into the local directory. announce: this
        life will sync (not a look): its own manifest first, naming the objects it restores (see the module)."""
        self._reset()
        listed = list(self.store.list(self.prefix))
        present = {info.key for info in listed}
        chosen: dict[str, tuple[int, Entry]] = {}
        restored: tuple[int | None, datetime | None] = (None, None)  # this rank's manifest: its step and time
        for rank, (seq, key, body) in sorted(self._whole_manifests(listed, present).items(), reverse=True):
            files = {rel: Entry(**{k: v for k, v in fields.items() if k in ("key", "size", "version")})
                     for rel, fields in body["files"].items()}
            written = _when(body.get("written_at"))
            if self.restored_from is None or (written or _EPOCH) > (self.restored_from[1] or _EPOCH):
                self.restored_from = (key, written)
            step = body.get("step") if isinstance(body.get("step"), int) else None
            if rank == self.rank:  # rank 0 last: it wins
                self.seq, self._named, restored = seq, files, (step, written)
            self._versions.update(dict.fromkeys(files, (written, step)))
            chosen.update({rel: (rank, entry) for rel, entry in files.items()})
        # a half save an older agent named (the files its final sync found closed) would be picked by the resume
        # rule and fail to load: it is not restored, and the next manifest no longer names it
        half = judge({rel: (entry.size, 0, 0) for rel, (_, entry) in chosen.items()}, {}, None, rank=0)
        for path, why in sorted(half.partial.items()):
            self.say(f"checkpoint {half.saves[path].label} not restored: {why}; the whole saves before it are")
        chosen = {rel: kept for rel, kept in chosen.items() if half.of.get(rel) not in half.partial}
        started = time.monotonic()
        # what an earlier life of this rank left unnamed (a sync cut short): deleted after the next manifest, if
        # that life is surely gone (its objects are much older than the newest); a recent one may still sync
        mine = [info for info in listed if info.key.startswith((self._key(f"files/{self.rank}/"),
                                                                 self._key(f"manifests/{self.rank}/")))]
        self._known = {info.key for info in mine if "/manifests/" in info.key}
        self._ages = {info.key: info.last_modified for info in mine}
        self._unnamed |= {info.key for info in mine if info.last_modified < self.clock() - LEFTOVER_AGE}
        if announce and self._named:  # it stands on those objects now: an earlier life must not delete them
            self._write_manifest(self.seq + 1, {rel: e for rel, e in self._named.items() if rel in chosen}, *restored)
            self._reused = {rel for rel, entry in self._named.items() if f"-a{self.attempt}/" not in entry.key}

        def one(rel: str, entry: Entry) -> int:
            path = safe_path(self.local, rel)
            retried(f"restore {rel}", lambda: self.store.download_file(
                self._key(entry.key), path, version=entry.version, size=entry.size), sleep=self.sleep)
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
            self._closed[rel] = st
            if LAST.fullmatch(rel.rpartition("/")[2]):
                self._steps[rel] = saved_step(self.local / rel)
            if rank == self.rank:
                self._mine[rel] = (st, entry)
            else:
                self._theirs[rel] = st
        return Moved(files=len(done), bytes=sum(done.values()), seconds=time.monotonic() - started)

    # ---- sync ---------------------------------------------------------------------------------------------
    def sync(self, *, final: bool = False, leave_out: Mapping[str, str] | None = None, cut_ns: int | None = None,
             deadline: float | None = None, stop: threading.Event | None = None) -> Moved:
        """Upload what is complete and changed, then write a manifest if the directory's content changed.

        final: the process has ended (one scan; leave_out names files that may be half-written and why, cut_ns
        excludes files modified at or after it). deadline (time.monotonic()): no upload starts after it less
        the manifest's share. stop: a periodic sync asked to end early (the final sync is about to run)."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return Moved()
        try:
            return self._sync(final, leave_out, cut_ns, deadline, stop)
        finally:
            self._lock.release()

    def _sync(self, final: bool, leave_out: Mapping[str, str] | None, cut_ns: int | None, deadline: float | None,
              stop: threading.Event | None) -> Moved:
        step, looked = self.step(), time.monotonic()
        ready = complete(self.local, self.settle, final=final, leave_out=leave_out, cut_ns=cut_ns,
                         writers=self.writers, empty_before=self._empty, stop=stop)
        if not final and not self.live():  # a file the agent's signal cut mid-write looks closed and quiet now
            return Moved()  # the final sync judges by what was open at the signal
        if not final:  # open at a signal and unchanged since: perhaps cut (SIGTERM ended its writer)
            for rel, st in list(ready.files.items()):
                if self.cut(self.local, rel, st):
                    del ready.files[rel]
                    ready.held[rel] = CUT
        stopping = stop is not None and stop.is_set() and not final
        self._empty = frozenset(rel for rel, st in ready.files.items() if st[0] == 0) | frozenset(
            rel for rel, why in ready.held.items() if why == EMPTY)
        self._learn(ready)
        # a library's save goes up as a set, once whole (agent/saves.py); never from copies of its files. Judged on
        # this rank's own files: another rank's, restored beside them, are not this rank's to wait for
        own = {rel: st for rel, st in ready.stats.items() if self._theirs.get(rel) != st}
        saves = judge(own, ready.held, read_pointers(self.local, own), rank=self.rank)
        self._in_saves = set(saves.of)
        self._in_place -= self._in_saves
        for path, why in saves.partial.items():
            for rel in saves.saves[path].files:
                ready.files.pop(rel, None)
                ready.held.setdefault(rel, why)
        gone = self._gone() if self._reused else set()
        changed = {rel: st for rel, st in ready.files.items() if rel in gone or (
            self._theirs.get(rel) != st and (rel not in self._mine or self._mine[rel][0] != st))}
        seq = self.seq + 1
        uncopied: dict[str, str] = {}
        if stopping:
            changed = {}  # the final sync takes over; do not start uploads it would wait for
        elif not final:
            uncopied = self.copies.take(self._wanted(), self.writers, self.copy_wait)
            self._kept_open |= self._never_closed(self.copies.open_throughout)
        copies = self._pending(ready.present - self._in_saves, ready.held if final else None, stop)
        changed = {rel: st for rel, st in changed.items() if rel not in copies} | {
            rel: copy.stat for rel, copy in copies.items()}

        def key_of(rel: str) -> str:
            return self._key(f"files/{self.rank}/{seq:08d}-a{self.attempt}/{rel}")

        entries, moved, errors = self._upload(changed, copies, key_of, deadline, final, stop)
        deleted = {rel for rel, exc in errors.items() if isinstance(exc, _Gone)}  # rotated away: a deletion
        errors = {rel: exc for rel, exc in errors.items() if rel not in deleted}
        ready.present -= deleted
        rewritten = {rel for rel, exc in errors.items() if isinstance(exc, _Changed)} - self._in_saves
        self._in_place |= rewritten
        if rewritten and not final and not stopping and self.live():
            # rewritten during its upload (a file first seen closed): once more, from a whole copy
            uncopied |= self.copies.take({rel: self._newest(rel) for rel in rewritten}, self.writers, self.copy_wait)
            self._kept_open |= self._never_closed(self.copies.open_throughout)
            again = {rel: copy for rel in rewritten if (copy := self.copies.newest(rel)) is not None}
            more, moved_again, errors_again = self._upload({rel: c.stat for rel, c in again.items()}, again, key_of,
                                                           deadline, final, stop)
            copies, entries = copies | again, entries | more
            changed |= {rel: copy.stat for rel, copy in again.items()}
            errors = {rel: exc for rel, exc in errors.items() if rel not in more} | errors_again
            moved.add(moved_again)
            moved.failed = sorted(rel for rel, exc in errors.items() if not isinstance(exc, _Gone))
        # a save all of whose changed files did not land keeps its previous entries (or stays unnamed)
        torn = {saves.of[rel]: rel for rel in sorted(changed.keys() - entries.keys()) if rel in saves.of}
        entries = {rel: entry for rel, entry in entries.items() if saves.of.get(rel) not in torn}
        uploaded = {rel: (changed[rel], entry) for rel, entry in entries.items()}
        when = self.clock()
        for rel, (st, entry) in uploaded.items():
            self._mine[rel] = (st, Entry(entry.key.removeprefix(self.prefix), entry.size, entry.version))
            self._theirs.pop(rel, None)
            self._versions[rel] = (when, step)
            if LAST.fullmatch(rel.rpartition("/")[2]):  # the version uploaded: its copy, or the file if unchanged
                source = copies[rel].path if rel in copies else self.local / rel
                found = saved_step(source)
                self._steps[rel] = found if rel in copies or stat_of(source) == st else None
            self.copies.done(rel, copies[rel].taken if rel in copies else looked)
            if final and rel in ready.held:  # being written at the stop: its newest whole copy went up instead
                self.say(f"checkpoint {rel} was being written when the job's processes were stopped: its newest"
                         f" whole copy ({age(time.monotonic() - copies[rel].taken)} old) went up instead")
            ready.held.pop(rel, None)
        # a file deleted locally leaves the manifest; one present but incomplete keeps its last complete copy,
        # unless that copy is gone from the bucket
        self._mine = {rel: kept for rel, kept in self._mine.items()
                      if rel in ready.present and (rel not in gone or rel in uploaded)}
        self._theirs = {rel: st for rel, st in self._theirs.items() if rel in ready.present}
        files = self._whole({rel: entry for rel, (_, entry) in self._mine.items()}, saves, ready.present)
        files = self._lasts(files, ready.present)
        if files != self._named:
            self._write_manifest(seq, files, step)
            if deadline is None or time.monotonic() < deadline:
                self._clean()
        if final:
            self.copies.clear()
        late = "not started before the Spot notice's deadline"
        failed = {rel: CHANGED if isinstance(exc, _Changed) else f"upload failed: {exc}" for rel, exc in errors.items()}
        failed |= {rel: f"{failed[rel]}; {why}" if rel in failed else why for rel, why in uncopied.items()
                   if rel not in uploaded and (rel in failed or rel not in changed)}
        failed |= dict.fromkeys(changed.keys() - uploaded.keys() - errors.keys() - deleted - saves.of.keys(), late)
        # a save is accounted for as one: why it is not whole, or which of its files did not go up and why
        failed = {rel: why for rel, why in failed.items() if rel not in saves.of}
        failed |= {saves.saves[path].label: f"{saves.saves[path].inside(rel)}: {failed_of(errors, rel, late)}"
                   for path, rel in torn.items() if not saves.saves[path].files & deleted}  # one deleted: gone
        held = {rel: why for rel, why in ready.held.items() if rel not in saves.of}
        held |= {saves.saves[path].label: why for path, why in saves.partial.items()}
        self._account(held, failed, ready.present - saves.of.keys() | {saves.saves[p].label for p in saves.saves},
                      final, saves, files)
        return moved

    def _upload(self, files: dict[str, Stat], copies: dict[str, Copy], key_of: Callable[[str], str],
                deadline: float | None, final: bool, stop: threading.Event | None,
                ) -> tuple[dict[str, Entry], Moved, dict[str, BaseException]]:
        self._unnamed |= {key_of(rel) for rel in files}  # an upload discarded or cut short leaves an object
        direct = {rel: st for rel, st in files.items() if rel not in copies and rel not in self._in_saves}
        with self.copies.reading(list(copies.values())), self._copying_meanwhile(final, stop, direct):
            return upload(self.store, self.local, files, key_of,
                          None if deadline is None else deadline - _MANIFEST_TIME, self.sleep, copies)

    def _learn(self, ready: Ready) -> None:
        """Which files the job writes while it runs: open for writing at a look, or seen closed and then with the
        same inode and other content (rewritten in place between two looks). Those go up from whole copies."""
        self._in_place |= {rel for rel, why in ready.held.items() if why in (OPEN, EMPTY)}
        for rel, st in ready.files.items():
            before = self._closed.get(rel)
            if before is not None and before[2] == st[2] and before != st:
                self._in_place.add(rel)
            self._closed[rel] = st
        self._in_place &= ready.present
        self._kept_open = (self._kept_open & ready.present) - ready.files.keys()
        self._closed = {rel: st for rel, st in self._closed.items() if rel in ready.present}

    def _never_closed(self, rels: set[str]) -> set[str]:
        """Of the files a copy waited for in vain, those never seen closed (at a look, a copy or an upload): kept
        open (a log), not a save that took longer than the wait."""
        return {rel for rel in rels if rel not in self._closed and rel not in self._mine
                and self.copies.newest(rel) is None}

    def _kept(self, rel: str) -> Stat | None:
        """The local state of the version of rel the bucket holds."""
        return self._mine[rel][0] if rel in self._mine else self._theirs.get(rel)

    def _newest(self, rel: str) -> Stat | None:
        """The local state of the newest whole version of rel kept: its newest copy, else the bucket's."""
        return copy.stat if (copy := self.copies.newest(rel)) is not None else self._kept(rel)

    def _wanted(self) -> dict[str, Stat | None]:
        """The files written while the job runs (but one kept open), each with the newest version already kept: no
        copy is taken if it is unchanged."""
        return {rel: self._newest(rel) for rel in self._in_place - self._kept_open}

    def _pending(self, present: set[str], held: Mapping[str, str] | None, stop: threading.Event | None,
                 ) -> dict[str, Copy]:
        """The newest copies newer than the bucket's versions, to upload instead of the live files: every one
        during the run; at the end, those of the files left out (being written at the stop; the others are
        whole and no older)."""
        pending = {}
        for rel in present if held is None else held.keys() & present:
            copy = self.copies.newest(rel)
            if copy is None:
                continue
            if copy.stat == self._kept(rel):
                self.copies.done(rel, copy.taken)
            elif held is not None or stop is None or not stop.is_set():
                pending[rel] = copy
        return pending

    @contextlib.contextmanager
    def _copying_meanwhile(self, final: bool, stop: threading.Event | None, direct: Mapping[str, Stat],
                           ) -> Iterator[None]:
        """While a periodic upload runs, copy the files written while the job runs every copy_every seconds, so
        the newest whole copy stays that fresh however long uploads take (the final sync uploads it). A file being
        uploaded from the directory is copied too once rewritten since its look (its upload will fail)."""
        if final or self.copy_every is None or not (self._in_place or direct):
            yield
            return
        done = threading.Event()

        def copying() -> None:
            assert self.copy_every is not None
            while not done.wait(self.copy_every) and not (stop is not None and stop.is_set()) and self.live():
                try:
                    self.copies.take({**direct, **self._wanted()}, self.writers, self.copy_wait)
                except Exception as exc:  # the sync's own round tries again
                    log.warning("copying checkpoint files failed: %s", exc)

        thread = threading.Thread(target=copying, name="checkpoint-copies", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _gone(self) -> set[str]:
        """Once, at the first sync after a restore: the restored files whose objects an earlier life's delete took
        from the bucket meanwhile (it may have raced the restore). Uploaded again; never named as they were."""
        reused, self._reused = self._reused, set()
        present = {info.key for info in self.store.list(self._key(f"files/{self.rank}/"))}
        gone = {rel for rel in reused if rel in self._mine and self._key(self._mine[rel][1].key) not in present}
        if gone:
            self.say(f"{len(gone)} restored checkpoint files were deleted from the bucket meanwhile (e.g."
                     f" {sorted(gone)[0]}): uploading them again")
        return gone

    def _whole(self, files: dict[str, Entry], saves: Saves, present: set[str]) -> dict[str, Entry]:
        """What the manifest names, a library's save only whole: one the job has begun to delete (a file of it named
        before is gone) leaves it; but the newest save of a series named before stays named, deleted or not, while
        the job has a newer one of that series that is not named yet (its rotation deleted the older one first,
        or took it during its upload): the bucket always holds a whole save for the resume rule to pick."""
        before = group(self._named)
        for save in before.saves.values():
            if save.path in saves.saves and not save.files <= present:
                files = {rel: entry for rel, entry in files.items() if rel not in save.files}
        now = group(files)
        for series in {save.series for save in before.saves.values() if save.habit is not None}:
            last = max((s for s in before.saves.values() if s.series == series), key=lambda s: s.number)
            newer = [s for s in saves.saves.values() if s.series == series and s.number > last.number]
            named = [s for s in now.saves.values() if s.series == series and s.number >= last.number]
            if newer and not named:
                files |= {rel: self._named[rel] for rel in last.files}
        return files

    def _lasts(self, files: dict[str, Entry], present: set[str]) -> dict[str, Entry]:
        """Lightning's last.ckpt named as the newest whole save beside it where its own version is older or missing
        (saves.stand_in): from now on that is the bucket's version of it, as if uploaded for its local state."""
        self._stood_in = {}
        for rel in sorted(r for r in present | self._named.keys() if LAST.fullmatch(r.rpartition("/")[2])):
            save = stand_in(rel, files, self._steps.get(rel), rel in present or rel in self._named)
            if save is None:
                continue
            files[rel], self._steps[rel], self._stood_in[rel] = files[save.path], save.number, save.path
            self._versions[rel] = self._versions.get(save.path, (None, None))
            if (st := stat_of(self.local / rel)) is not None:
                self._mine[rel] = (st, files[rel])
        return files

    def _account(self, held: dict[str, str], failed: dict[str, str], present: set[str], final: bool, saves: Saves,
                 named: Mapping[str, Entry]) -> None:
        """Which files (and saves) have their newest version not in the bucket, since when and why; say what must be
        said: every file or save a final sync left out, and any waiting longer than overdue_after."""
        now = time.monotonic()
        why = held | failed
        self._waiting = {key: (self._waiting.get(key, (now, ""))[0], why[key]) for key in present if key in why}
        for key, (since, reason) in sorted(self._waiting.items()):
            if (key, reason) in self._told:
                continue
            if final and key in held:
                self.say(f"checkpoint {key} left out: {reason}; {self._previous(key, saves, named)}")
            elif self.overdue_after is not None and now - since > self.overdue_after:
                self.say(f"checkpoint {key} has not reached the bucket for {age(now - since)}: {reason};"
                         f" {self._previous(key, saves, named)}")
            else:
                continue
            self._told.add((key, reason))

    def _previous(self, key: str, saves: Saves, named: Mapping[str, Entry]) -> str:
        """What stays in the bucket instead: the file's previous version, or the newest whole save of its series."""
        save = next((s for s in saves.saves.values() if s.label == key), None)
        if save is not None:
            stays = [s for s in group(named).saves.values() if s.series == save.series and s.number < save.number]
            if not stays:
                return "no earlier whole save of it is in the bucket"
            last = max(stays, key=lambda s: s.number)
            own = last.number if last.habit is not None else None  # a save's own step: its name's
            return f"{last.label} (whole{self._about(max(last.files, key=self._uploaded), own)}) stays"
        if key in self._stood_in:
            stands = self._stood_in[key]
            return f"{stands} (whole{self._about(stands, self._steps.get(key))}) stands in for it"
        if key not in self._mine and key not in self._theirs:
            return "no earlier version of it is in the bucket"
        about = self._about(key, self._steps[key] if key in self._steps else self._versions.get(key, (None, None))[1])
        return "the previous version " + (f"({about.removeprefix(', ')}) " if about else "") + "stays"

    def _uploaded(self, rel: str) -> datetime:
        return self._versions.get(rel, (None, None))[0] or _EPOCH

    def _about(self, rel: str, step: int | None) -> str:
        """", step N, M s old" of the version of rel in the bucket, as far as known."""
        when = self._versions.get(rel, (None, None))[0]
        about = [f"step {step}"] if step is not None else []
        if when is not None:
            about.append(f"{age((self.clock() - when).total_seconds())} old")
        return "".join(f", {part}" for part in about)

    def _manifest_key(self, seq: int) -> str:
        return self._key(f"manifests/{self.rank}/{seq:08d}.json")

    def _write_manifest(self, seq: int, files: dict[str, Entry], step: int | None = None,
                        written_at: datetime | None = None) -> None:
        self._unnamed |= {self._key(entry.key) for entry in self._named.values()}
        if self.seq:
            self._unnamed.add(self._manifest_key(self.seq))
        while True:
            body = {"seq": seq, "rank": self.rank, "attempt": self.attempt,
                    "written_at": (written_at or datetime.now(UTC)).isoformat(), "step": step,
                    "files": {rel: asdict(entry) for rel, entry in sorted(files.items())}}
            key, data = self._manifest_key(seq), json.dumps(body, indent=1).encode()
            try:
                self._known.add(key)
                retried(f"manifest {seq}", partial(self.store.put_if_absent, key, data), sleep=self.sleep)
                break
            except PreconditionFailed:  # another life got there first (never overwrite it), or our own write
                with contextlib.suppress(NotFound):  # landed and its response was lost: the resend found it
                    if retried(f"manifest {seq} check", partial(self.store.get, key), sleep=self.sleep).data == data:
                        break
                seq += 1
        self.seq, self._named = seq, files

    def _clean(self) -> None:
        """Delete this rank's objects the newest manifest does not name (old versions, deleted files, older
        manifests), known without listing the bucket; a failed delete is tried again after the next manifest."""
        self._unnamed -= {self._key(entry.key) for entry in self._named.values()} | {self._manifest_key(self.seq)}
        if not self._unnamed:
            return
        if self.superseded():  # a later attempt may have restored these objects: its life collects them
            log.warning("job moved on from attempt %d: not deleting old checkpoint objects", self.attempt)
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


def publish(store: ObjectStore, local: Path, prefix: str, *, leave_out: Mapping[str, str] | None = None,
            cut_ns: int | None = None, deadline: float | None = None, sleep: Sleep = time.sleep) -> Moved:
    """Upload a finished directory (artifacts) to prefix<path>, then prefix.manifest.json; delete objects
    under prefix the manifest does not name (an earlier attempt's). Raises if any file failed."""
    ready = complete(local, 0.0, final=True, leave_out=leave_out, cut_ns=cut_ns)
    entries, moved, _ = upload(store, local, ready.files, lambda rel: prefix + rel, deadline, sleep)
    if moved.failed:
        raise RuntimeError(f"uploading {len(moved.failed)} files of {local} failed, e.g. {moved.failed[0]}")
    files = {rel: asdict(Entry(rel, e.size, e.version)) for rel, e in sorted(entries.items())}
    manifest = {"written_at": datetime.now(UTC).isoformat(), "files": files}
    retried("artifacts manifest", lambda: store.put(prefix.rstrip("/") + ".manifest.json",
                                                    json.dumps(manifest, indent=1).encode(), "application/json"),
            sleep=sleep)
    keep = {prefix + rel for rel in entries}
    stale = [info.key for info in store.list(prefix) if info.key not in keep]
    _, errors = parallel(((key, partial(store.delete, key)) for key in stale), workers(store))
    if errors:  # the manifest already says what is current
        log.warning("deleting %d stale objects under %s failed: %s", len(errors), prefix, next(iter(errors.values())))
    return moved
