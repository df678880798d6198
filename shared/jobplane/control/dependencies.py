"""What each entry of a job's `after:` names, as it stands now, for the launcher's gate (jobplane.decide.dependencies):
a job's record (a GET), else an array's (or a sweep's) record, sweeps/<id>/sweep.json, which says when it ended and
how (an array COMPLETED: every member SUCCEEDED), else nothing of that id."""

from __future__ import annotations

from collections.abc import Sequence

from jobplane.decide.dependencies import Dependency, entries
from jobplane.store.registry import JobNotFound, Registry


def read(reg: Registry, after: Sequence[str]) -> list[Dependency]:
    from jobplane.sweeps import store  # only a job waiting for another reads a dependency

    found = []
    for entry in entries(after):
        try:
            job = reg.job(entry.target)
            found.append(Dependency(entry.target, job.state, job.reason, entry.kind))
            continue
        except JobNotFound:
            pass
        try:
            record = store.get(reg, entry.target)[0]
        except store.SweepNotFound:
            found.append(Dependency(entry.target, None, kind=entry.kind))
            continue
        found.append(Dependency(entry.target, record.state, record.reason, entry.kind, array=True))
    return found
