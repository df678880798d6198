"""Whole private copies of the checkpoint files a job rewrites in place, taken with its processes frozen.

`torch.save(state, "checkpoint.pt")` every few seconds leaves a file that is whole only between two saves, and
a big one takes longer to upload, or even to copy, than the pause between them. So a sync waits for the save in
progress to end (the file closed: no process holds it open for writing, agent/writers.py), freezes the job's
processes (SIGSTOP, as before a signal: agent/process.py `paused`), copies the file beside the checkpoint
directory and lets them go on (SIGCONT). Nothing can rewrite the file during the copy, and a copy taken while
a process still held it open is never kept.

- The freeze is bounded: `freeze` seconds at most, enforced by a watchdog that continues the job whatever the
  copy does. A copy that did not end within it is dropped (and said, once); the sync then uploads the live file
  when it finds it closed, if its upload ends before the next save begins.
- The copy is in-kernel (copy_file_range: page cache to page cache, or a reflink on XFS and Btrfs), by a thread
  at the highest priority meanwhile (the job waits for it): 800 MB take about 0.2 s on an idle machine.
- No copy starts once the agent has begun to stop the job (the freezer yields None): a file its signal cut
  mid-write looks closed and quiet, and must not be taken for whole.
- Disk: at most two whole copies of a file, the newest and one an upload is reading; each goes once superseded
  and unread, or once uploaded. While a newer one is being taken it is a third: the newest stays until its
  successor is whole, so a copy the job's next save spoils never leaves the sync without one. `.<dir>.staging/`
  beside the checkpoint directory, on the same filesystem.

Where nothing can be frozen (no process of the job runs now; tests that write from threads), the freezer yields
a pause that is always held: a copy then counts only if the file stayed closed and unchanged from before the
copy to after it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from jobplane.agent.process import urgent
from jobplane.agent.transfer import Stat, stat_of
from jobplane.agent.writers import Closes, under

log = logging.getLogger("jobplane.agent")

CHUNK = 64 << 20  # bytes copied between two looks at the freeze
LOOK_EVERY = 0.05  # seconds between two looks at what is open, while waiting for a save to end
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


class Frozen(Protocol):
    def held(self) -> bool:
        """The job's processes are still stopped."""


Freezer = Callable[[float], AbstractContextManager[Frozen | None]]  # stop the job for at most N s; None: it is ending
Writers = Callable[[], set[str] | None]  # absolute paths open for writing now; None: the kernel cannot tell


class _Unfrozen:
    def held(self) -> bool:
        return True


@contextlib.contextmanager
def unfrozen(limit: float) -> Iterator[Frozen | None]:
    """No process of the job to freeze: copies count when the file did not change across them."""
    yield _Unfrozen()


@dataclass(frozen=True)
class Copy:
    """A whole version of a file: where its copy is, the live file's stat when copied, when (time.monotonic())."""

    path: Path
    stat: Stat
    taken: float


class Copies:
    """The copies of one checkpoint directory's files, in `staging`."""

    def __init__(self, local: Path, staging: Path, *, freezer: Freezer = unfrozen, freeze: float = 1.0,
                 cut: Callable[[str, Stat], bool] = lambda rel, st: False) -> None:
        self.local, self.staging, self.freezer, self.freeze = local, staging, freezer, freeze
        self.cut = cut  # that version of the file was open for writing at a signal: perhaps half-written
        self._newest: dict[str, Copy] = {}
        self._reading: dict[Path, int] = {}  # copies an upload is reading: how many uploads
        self._superseded: set[Path] = set()  # deleted once no upload reads them
        self._lock = threading.Lock()
        self._names = itertools.count(1)
        self.open_throughout: set[str] = set()  # files the last `take` waited for in vain

    def newest(self, rel: str) -> Copy | None:
        with self._lock:
            return self._newest.get(rel)

    def take(self, wanted: Mapping[str, Stat | None], writers: Writers, wait: float) -> dict[str, str]:
        """Copy each wanted file (relative path -> the stat of the version already kept, not copied again) once no
        process holds it open for writing, waiting up to `wait` seconds for a save in progress to end; returns why
        each file that is not copied now was not."""
        todo = {rel: kept for rel, kept in wanted.items() if stat_of(self.local / rel) not in (None, kept)}
        self.open_throughout = set()
        if not todo:
            return {}
        why, end = dict[str, str](), time.monotonic() + wait
        closes: Closes | None = None  # made when first needed: an inotify instance is slow to close (ms)
        try:
            with urgent():  # woken the moment a save ends, so the freeze comes before the next one begins
                while True:
                    with self.freezer(self.freeze) as frozen:  # frozen at once: a save may begin any moment
                        if frozen is None:  # the job is ending: what its files hold now is the final sync's to judge
                            return {}
                        ran_out = self._copy_closed(todo, why, writers, frozen)
                    if not todo or time.monotonic() >= end:
                        break
                    if ran_out:
                        continue
                    closes = closes or Closes({(self.local / rel).parent for rel in todo})
                    if not self._until_closed(todo, writers, closes, end - time.monotonic()):
                        break
        finally:
            if closes is not None:
                closes.close()
        self.open_throughout = todo.keys() - why.keys()
        return why | dict.fromkeys(self.open_throughout,
                                   f"open for writing throughout {wait:g} s, so no whole copy was taken")

    def _until_closed(self, todo: Mapping[str, Stat | None], writers: Writers, closes: Closes, timeout: float,
                      ) -> bool:
        """Until one of the files is closed after writing (False: timeout seconds passed first): told by inotify,
        else by a look at what is open every LOOK_EVERY seconds."""
        end = time.monotonic() + timeout
        while True:
            busy = writers()  # closed since the last look (before the watch began, say)?
            if busy is None or todo.keys() - under(busy, self.local):
                return True
            if closes.watching:
                return closes.wait({Path(rel).name for rel in todo}, end - time.monotonic())
            if time.monotonic() >= end:
                return False
            time.sleep(LOOK_EVERY)

    def _copy_closed(self, todo: dict[str, Stat | None], why: dict[str, str], writers: Writers,
                     frozen: Frozen) -> bool:
        """With the job frozen: copy the files no process holds open (changed since `todo` says), newest first,
        while the freeze lasts. Drops each file handled from todo, and says in `why` why one was not copied;
        True if the freeze ended with closed files left."""
        busy = writers()
        if busy is None:
            todo.clear()
            return False
        open_now = under(busy, self.local)
        stats = {rel: st for rel in todo if rel not in open_now and (st := stat_of(self.local / rel)) is not None}
        for rel in set(todo) - open_now - stats.keys():
            del todo[rel]  # gone
        for rel in sorted(stats, key=lambda r: stats[r][1], reverse=True):
            st = stats[rel]
            if st == todo[rel] or st[0] == 0 or self.cut(rel, st):  # nothing new; or empty, perhaps being opened
                del todo[rel]  # (see complete); or open at a signal and unchanged since
                continue
            if not frozen.held():
                return True
            try:
                copied = self._copy(self.local / rel, st, frozen)
            except OSError as exc:  # the disk is full, or the file went: the sync uploads the live file
                why[rel] = f"no whole copy could be taken beside the checkpoint directory ({exc})"
                del todo[rel]
                continue
            if copied is not None:
                self._keep(rel, copied)
                why.pop(rel, None)
                del todo[rel]
            elif not frozen.held():
                why[rel] = (f"copying it ({st[0]} bytes) takes longer than the {self.freeze:g} s the job may be frozen"
                            " for it (--checkpoint-freeze), and the job rewrote it before the copy ended")
            # else it changed under the freeze (a writer outside the job's processes): the next close
        return False

    def _copy(self, path: Path, st: Stat, frozen: Frozen) -> Copy | None:
        """Copy path into staging, the job frozen; if the freeze ends first, on while the file stays unchanged
        (the job in the pause between two saves). None (and no copy left) if it changed."""
        self.staging.mkdir(exist_ok=True)
        dest = self.staging / f"{next(self._names)}-{path.name}"
        try:
            if _copy_unchanged(path, dest, st, frozen.held) and stat_of(path) == st:
                return Copy(dest, st, time.monotonic())
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        dest.unlink(missing_ok=True)
        return None

    def _keep(self, rel: str, copy: Copy) -> None:
        with self._lock:
            older = self._newest.get(rel)
            self._newest[rel] = copy
            if older is not None:
                self._drop(older.path)

    def _drop(self, path: Path) -> None:
        if self._reading.get(path):
            self._superseded.add(path)
        else:
            path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def reading(self, copies: list[Copy]) -> Iterator[None]:
        """The copies an upload reads stay until it ends, even if newer ones are taken meanwhile."""
        with self._lock:
            for copy in copies:
                self._reading[copy.path] = self._reading.get(copy.path, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for copy in copies:
                    self._reading[copy.path] -= 1
                    if not self._reading[copy.path]:
                        del self._reading[copy.path]
                        if copy.path in self._superseded:
                            self._superseded.discard(copy.path)
                            copy.path.unlink(missing_ok=True)

    def done(self, rel: str, upto: float) -> None:
        """A version of rel at least as new as every copy taken before `upto` (time.monotonic()) is in the
        bucket: those copies are no longer needed."""
        with self._lock:
            copy = self._newest.get(rel)
            if copy is not None and copy.taken <= upto:
                del self._newest[rel]
                self._drop(copy.path)

    def clear(self) -> None:
        """Every copy not being read; the staging directory too, once empty."""
        with self._lock:
            for rel in list(self._newest):
                self._drop(self._newest.pop(rel).path)
        with contextlib.suppress(OSError):
            self.staging.rmdir()


def _copy_unchanged(src: Path, dest: Path, st: Stat, frozen: Callable[[], bool]) -> bool:
    """Copy src to dest in-kernel, a chunk at a time; once frozen() is False (the job goes on), only while src's
    stat stays `st`. False if it changed (or shrank) first."""
    fin = os.open(src, os.O_RDONLY)
    try:
        fout = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left, in_kernel = st[0], True
            while left > 0:
                if not frozen() and stat_of(src) != st:
                    return False
                n = 0
                if in_kernel:
                    try:
                        n = os.copy_file_range(fin, fout, min(CHUNK, left))
                    except OSError as exc:
                        if exc.errno not in _NO_COPY_RANGE:
                            raise
                        in_kernel = False  # another filesystem, or an old kernel: through user space
                if not in_kernel:
                    data = os.read(fin, min(CHUNK, left))
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fout, view):]
                    n = len(data)
                if n == 0:  # it shrank
                    return False
                left -= n
            return True
        finally:
            os.close(fout)
    finally:
        os.close(fin)
