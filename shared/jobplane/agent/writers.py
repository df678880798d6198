"""Which files under a directory some process is writing right now, as the kernel knows it (/proc).

A checkpoint file is complete when no process holds it open for writing: a script that rewrites
`checkpoint.pt` in place with `torch.save` every second has it open for a few milliseconds of each second,
and between two saves the file is whole. An open file descriptor's link in /proc/<pid>/fd carries the
descriptor's mode (its owner-write bit is set when it was opened for writing), and /proc/<pid>/maps lists
writable shared mappings (numpy.memmap); neither needs the file's content.

Every process the agent can read is looked at, not only the job's session: a data-loader worker or a
process that started its own session writes checkpoints too. Where /proc cannot tell (not Linux, not
mounted), `writing` returns None and the caller falls back to settle-by-time.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PROC = Path("/proc")


def kernel_can_tell(proc: Path = PROC) -> bool:
    return (proc / "self" / "fd").is_dir()


def writing(proc: Path = PROC) -> set[str] | None:
    """Absolute paths of the files some process holds open for writing or maps writable and shared; None
    when the kernel cannot tell."""
    if not kernel_can_tell(proc):
        return None
    found: set[str] = set()
    for pid in _pids(proc):
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
