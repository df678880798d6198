"""CPU seconds (user + sys) that this process and every process under it have spent, the dead and the living: what
a unit of the suite costs the machine's cores is the difference of two samples (tests/scheduling.py).

A child's time reaches its parent's count only when the parent reaps it, so a local cloud or a moto server
started by a session-scoped fixture would land on whichever test stopped it. The living descendants are counted
from /proc instead (each one's own time and that of the children it reaped), so time is charged to the unit that
was running when it was spent. A process that leaves the tree (a daemon reparented to init) is not counted from
then on: the counts are a floor.
"""

from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def spent() -> float:
    """CPU seconds of this process, its reaped children and its living descendants, so far."""
    own = os.times()
    return own.user + own.system + own.children_user + own.children_system + living_descendants()


def living_descendants(root: int | None = None) -> float:
    """CPU seconds of root's living descendants (and of the children they reaped), from /proc/PID/stat.

    One read of /proc: about 2 ms for 100 processes, so it is sampled per unit, not per test."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone since the listing
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., field 14 utime
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, list(children.get(os.getpid() if root is None else root, []))
    while todo:
        pid = todo.pop()
        total += ticks[pid]
        todo.extend(children.get(pid, []))
    return total / TICK
