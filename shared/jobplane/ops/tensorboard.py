"""A local copy of jobs' TensorBoard runs, kept in step with the bucket for `jobplane tensorboard`.

The agents upload a job's event files to teams/<owner>/<id>/tensorboard/<attempt>/<rank>/ (agent/tensorboard.py); the
copy lays them out one run per job and attempt, so runs compare side by side in TensorBoard:
<dest>/<job>/attempt-<n>/... (rank 0's), <dest>/<job>/attempt-<n>-rank-<r>/... (another rank's). An event file
only grows while its writer runs, so a newer object whose start is what the copy holds is appended to the
local file in place, as the writer itself does: TensorBoard, reading that file from where it stopped, sees the
new records. Anything else (a file rewritten, a trace replaced) is rewritten in place. A key that would leave its
run (`..`) is skipped, said once, and the copy goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from jobplane.model import keys
from jobplane.store.rooted import RootedStore

_UNDER = re.compile(r"^(\d+)/(\d+)/(.+)$")  # <attempt>/<rank>/<path under log_dir>


def run_name(job_id: str, attempt: int, rank: int) -> str:
    """The run's directory under the copy, as TensorBoard names the run."""
    return f"{job_id}/attempt-{attempt}" + (f"-rank-{rank}" if rank else "")


def local_path(dest: Path, job_id: str, attempt: int, rank: int, rel: str) -> Path:
    """dest/<run>/<rel>; a path that would leave its run (.., absolute) is refused."""
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts or PurePosixPath(rel).is_absolute():
        raise ValueError(f"refusing to write TensorBoard file {rel!r} outside {dest}")
    return dest.joinpath(*run_name(job_id, attempt, rank).split("/"), *parts)


@dataclass
class Synced:
    files: int = 0
    bytes: int = 0  # written locally
    runs: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)  # keys skipped (they would leave their run), said once


@dataclass
class LocalRuns:
    """The copy of these jobs' runs (each where its data is: JobRecord.data) under dest; sync() again and again
    fetches only what changed."""

    reg: RootedStore
    dest: Path
    jobs: list[keys.JobData]
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (size, last modified) fetched

    def sync(self) -> Synced:
        done = Synced()
        for data in self.jobs:
            job_id, prefix = data.job_id, keys.tensorboard_prefix(data)
            for key, modified, size in self.reg.listing(prefix):
                found = _UNDER.match(key.removeprefix(prefix))
                if found is None:
                    continue
                attempt, rank, rel = int(found.group(1)), int(found.group(2)), found.group(3)
                done.runs.add(run_name(job_id, attempt, rank))
                marker = (size, modified.isoformat())
                if self.seen.get(key) == marker:
                    continue
                self.seen[key] = marker  # a refused key too: said once, not at every sync
                try:
                    path = local_path(self.dest, job_id, attempt, rank, rel)
                except ValueError as exc:  # one bad key (a job writes what it likes) stops no other file or job
                    done.refused.append(str(exc))
                    continue
                done.bytes += _update(path, self.reg.get_bytes(key))
                done.files += 1
        return done


def _update(path: Path, data: bytes) -> int:
    """Make the file hold data, writing in place (never a new inode: a reader keeps its open file); an append
    when the file holds the start of data. Returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        f.seek(0)
        held = f.read()
        if data.startswith(held):
            f.write(data[len(held):])
            return len(data) - len(held)
    with path.open("r+b") as f:
        f.write(data)
        f.truncate()
    return len(data)
