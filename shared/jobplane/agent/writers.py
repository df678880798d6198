"""Which files under a directory some process is writing right now, as the kernel knows it (/proc).

A checkpoint file is complete when no process holds it open for writing: a script that rewrites
`checkpoint.pt` in place with `torch.save` every second has it open for a few milliseconds of each second,
and between two saves the file is whole. An open file descriptor's link in /proc/<pid>/fd carries the
descriptor's mode (its owner-write bit is set when it was opened for writing), and /proc/<pid>/maps lists
writable shared mappings (numpy.memmap); neither needs the file's content.

Every process the agent can read is looked at, not only the job's session: a data-loader worker or a
process that started its own session writes checkpoints too (at a signal, the processes it reaches first, the
others after it: agent/keeper.py). Where /proc cannot tell (not Linux, not mounted), `writing` returns None and
the caller falls back to settle-by-time.

`Closes` says the moment a save ends (inotify), for a copy taken between two saves (agent/copies.py).
"""

from __future__ import annotations

import ctypes
import os
import select
import stat
import struct
import time
from collections.abc import Collection
from pathlib import Path

PROC = Path("/proc")


def kernel_can_tell(proc: Path = PROC) -> bool:
    return (proc / "self" / "fd").is_dir()


def writing(proc: Path = PROC, *, only: Collection[int] | None = None, but: Collection[int] = ()) -> set[str] | None:
    """Absolute paths of the files some process (of `only`, if given; none of `but`) holds open for writing or
    maps writable and shared; None when the kernel cannot tell."""
    if not kernel_can_tell(proc):
        return None
    found: set[str] = set()
    skip = {str(pid) for pid in but}
    for pid in _pids(proc) if only is None else [str(pid) for pid in only]:
        if pid not in skip:
            found |= _writable_fds(proc / pid) | _writable_maps(proc / pid)
    return found


def under(paths: set[str], directory: Path) -> set[str]:
    """The paths inside directory, relative to it (POSIX)."""
    try:
        inside = str(directory.resolve(strict=True)) + os.sep
    except OSError:  # no directory: nothing in it
        return set()
    return {path[len(inside):] for path in paths if path.startswith(inside)}


def open_for_writing(directory: Path, proc: Path = PROC) -> set[str] | None:
    """The files under directory (relative POSIX paths) a process is writing; None when the kernel cannot tell."""
    paths = writing(proc)
    return None if paths is None else under(paths, directory)


def _pids(proc: Path) -> list[str]:
    try:
        return [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def _writable_fds(pid_dir: Path) -> set[str]:
    paths: set[str] = set()
    fd_dir = pid_dir / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read (the agent runs as root on a VM: every process is)
        return paths
    for fd in fds:
        link = fd_dir / fd
        try:
            if os.lstat(link).st_mode & stat.S_IWUSR:
                paths.add(os.readlink(link))
        except OSError:  # closed meanwhile
            continue
    return paths


def _writable_maps(pid_dir: Path) -> set[str]:
    """Files mapped writable and shared (perms like `rw-s`): their writes reach the file with no write()."""
    try:
        lines = (pid_dir / "maps").read_text(errors="replace").splitlines()
    except OSError:
        return set()
    paths: set[str] = set()
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[1][1] == "w" and parts[1][3] == "s" and parts[5].startswith("/"):
            paths.add(parts[5])
    return paths


IN_CLOSE_WRITE = 0x08
IN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class Closes:
    """Tells when a file in some directories is closed after writing (inotify's IN_CLOSE_WRITE), so a waiter
    acts the moment a save ends, spending nothing meanwhile. `watching` is False where inotify is not to be had
    (not Linux, no instances left): the caller then looks now and then."""

    def __init__(self, directories: set[Path]) -> None:
        self._fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        if all(libc.inotify_add_watch(fd, os.fsencode(d), IN_CLOSE_WRITE) >= 0 for d in directories):
            self._fd = fd
        else:
            os.close(fd)

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def wait(self, names: set[str], timeout: float) -> bool:
        """Until a file of one of these names (in a watched directory) is closed after writing: True, or False
        once timeout seconds have passed."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            if not select.select([self._fd], [], [], left)[0]:
                return False
            data, offset = os.read(self._fd, 1 << 16), 0
            while offset < len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = os.fsdecode(data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0"))
                offset += _EVENT.size + length
                if name in names or mask & IN_Q_OVERFLOW:
                    return True
        return False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
