"""Job operations over a registry: submit a drop, find a job (recorded, still in queue/, or rejected), list
jobs, read log chunks, metrics and artifacts, follow a job to a goal, cancel (a queued job too). The public face
of these is jobplane.sdk; the CLI is built on that.

A queued job is a job. The launcher creates a job's record before it deletes the drop (and writes a
rejection before it deletes a bad one), so at every instant one of drop, record or rejection exists, and
find() reads them in an order that cannot miss the hand-over.

Cloud-neutral: what reads a job's objects takes the registry's RootedStore, what reads or changes its record the
job Registry, plus a factory for the Compute adapter where instances matter. Which store and adapter to build is
the caller's choice (jobplane.ops.backend for the SDK).
"""

from __future__ import annotations

import contextlib
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from jobplane.clouds.base import Compute, NotFound, PreconditionFailed
from jobplane.model import drops, keys, sysmetrics, yaml_input
from jobplane.model.clock import utcnow
from jobplane.model.errors import FieldError, SpecError
from jobplane.model.jobrecord import JobRecord
from jobplane.model.metrics import Sample, decode
from jobplane.model.spec import URI_SCHEMES, job_id_problem, parse_spec
from jobplane.model.states import TERMINAL, State
from jobplane.model.yaml_input import load_document
from jobplane.store.registry import JobExists, JobNotFound, Registry
from jobplane.store.rooted import RootedStore
from jobplane.views import cost, sysview
from jobplane.views.jobview import (
    JobView,
    Status,
    human_duration,
    readable_job_id,
    rejected_reason,
    status,
    view_row,
)

ComputeFactory = Callable[[], Compute]
Upload = Callable[[str, Path], None]  # (registry-relative key, local file)


class JobError(Exception):
    """A job operation the user asked for cannot be done; the message says why in one line."""


class SpecInvalid(JobError):
    """A spec that cannot be submitted, with every problem found (each naming its field)."""

    def __init__(self, source: str | None, errors: list[FieldError]) -> None:
        super().__init__((f"{source}: " if source else "") + "; ".join(map(str, errors)))
        self.source, self.errors = source, errors


@dataclass(frozen=True)
class Backend:
    """One registry and the cloud behind it. `url` is the bucket's URI (s3://b, gs://b): code bundles and
    specs name objects by it. Build one per cloud in one place (the CLI's connect)."""

    reg: Registry
    url: str
    compute: ComputeFactory
    upload: Upload


# ---- finding a job -----------------------------------------------------------------------------------------
def find(reg: Registry, job_id: str) -> JobView:
    """The job as recorded, else as still queued, else as rejected; JobNotFound if none of them exists.

    Record, then drop, then the record again: the launcher records a job before it deletes the drop, so a
    drop gone between the first two reads means the record is there for the third.
    """
    if job_id_problem(job_id):
        raise JobNotFound(job_id)
    for look in (_recorded, _queued, _recorded, _rejected):
        view = look(reg, job_id)
        if view is not None:
            return view
    raise JobNotFound(job_id)


def _recorded(reg: Registry, job_id: str) -> JobView | None:
    try:
        return JobView.of(reg.job(job_id))
    except JobNotFound:
        return None


def _queued(reg: RootedStore, job_id: str) -> JobView | None:
    """The job's drop, under queue/ or an owner's queue/<owner>/ (queue/ holds only drops not yet taken)."""
    for key, modified, _ in reg.listing(keys.QUEUE):
        drop = keys.parse_drop(key)
        if drop is None or drop.job_id != job_id:
            continue
        try:
            data = reg.get_bytes(key)
        except NotFound:
            return None  # taken by the launcher since the listing
        return queued_view(job_id, key, data, modified)
    return None


def queued_view(job_id: str, key: str, data: bytes, dropped_at: datetime) -> JobView:
    """A drop as the launcher will read it (same parse), or with the reason it will reject it."""
    drop = keys.parse_drop(key)
    try:
        if drop is None:
            raise SpecError([FieldError("(file)", f"{key} is not a queue entry")])
        spec = drops.read_spec(drop, data)
    except SpecError as exc:
        return JobView(job_id, State.QUEUED, dropped_at, drop=key,
                       reason="the launcher will reject it: " + "; ".join(map(str, exc.errors)))
    return JobView(job_id, State.QUEUED, dropped_at, spec, drop=key)


def _rejected(reg: RootedStore, job_id: str) -> JobView | None:
    try:
        blob = reg.get_object(keys.rejected_error(job_id))
    except NotFound:
        return None
    try:
        reason = rejected_reason(yaml_input.load(blob.data))
    except (yaml.YAMLError, ValueError):
        reason = "rejected"
    return JobView(job_id, State.INVALID, blob.last_modified, reason=reason)


def list_rows(reg: Registry, include_done: bool, now: datetime | None = None) -> list[dict[str, Any]]:
    """`jobplane ls`'s rows, longest waiting first: live jobs (or every job), drops still in queue/ and, with
    include_done, rejected ones."""
    now = now or utcnow()
    return sorted((view_row(view, now) for view in list_views(reg, include_done)), key=lambda r: r["age"],
                  reverse=True)


def list_views(reg: Registry, include_done: bool) -> list[JobView]:
    """Live jobs (or every job) by id, then drops still in queue/ and, with include_done, rejected ones."""
    ids = recorded_ids(reg) if include_done else set(reg.active())
    views, recorded = [], set()
    for job_id in sorted(ids):
        try:
            views.append(JobView.of(reg.job(job_id)))
        except JobNotFound:
            continue  # finished between the listing and the read, or a folder with no record yet
        recorded.add(job_id)
    queued = set()
    for key, modified, _ in reg.listing(keys.QUEUE):
        drop = keys.parse_drop(key)
        job_id = drop.job_id if drop else ""
        if not job_id or job_id in recorded or job_id in queued:
            continue
        try:
            views.append(queued_view(job_id, key, reg.get_bytes(key), modified))
        except NotFound:
            continue  # the launcher took it since the listing; the next ls shows its record
        queued.add(job_id)
    if include_done:
        for key, modified, _ in reg.listing(keys.REJECTED):
            rejected = keys.parse_rejected_error(key)
            if rejected and rejected not in recorded | queued:  # a recorded INVALID job shows once
                views.append(JobView(rejected, State.INVALID, modified, reason=rejected_reason(reg.get_json(key))))
    return views


def recorded_ids(reg: RootedStore) -> set[str]:
    """Every job that may have a record, live or not: the folders of jobs/, from a delimiter listing (a page per
    thousand jobs, whatever they wrote). A folder with no job.json yet (a code bundle's) reads as JobNotFound."""
    return {job_id for folder in reg.folders(keys.JOBS) if (job_id := keys.parse_job_folder(folder))}


def cost_rows(reg: Registry, by: str = "job", since: datetime | None = None,
              now: datetime | None = None) -> list[cost.Row]:
    """`jobplane cost`: every recorded job's estimated cost (instance time after `since`), summed by group."""
    now = now or utcnow()
    records = []
    for job_id in sorted(recorded_ids(reg)):
        with contextlib.suppress(JobNotFound):
            records.append(reg.job(job_id))
    return cost.summarize(records, now, by, since)


def gpu_idle_hours(reg: Registry, by: str = "owner", since: datetime | None = None) -> dict[str, float]:
    """`jobplane cost --gpu-idle`: GPU-hours spent under sysview.IDLE_UTILIZATION per group, from the system
    metrics of every recorded job that ran instances (after `since`). Reads each such job's system chunks."""
    hours: dict[str, float] = {}
    for job_id in sorted(recorded_ids(reg)):
        try:
            record = reg.job(job_id)
        except JobNotFound:
            continue
        if not record.usage:
            continue
        samples = [s for s in read_system(reg, record.data) if since is None or s.time >= since]
        idle = sysview.idle_gpu_hours(samples)
        for key in cost.group_keys(record, by):
            hours[key] = hours.get(key, 0.0) + idle
    return hours


# ---- submitting --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submission:
    """A checked spec ready to drop: its id, the document to write, the code directory to bundle, and the owner
    whose queue/<owner>/ it goes to. drawn: the id was made up from the spec's name and the time (neither given
    nor in the spec), so another may be drawn."""

    job_id: str
    doc: dict[str, Any]
    code_dir: Path | None
    owner: str = keys.DEFAULT_OWNER
    drawn: bool = False


def plan_submission(spec_file: Path, text: str, *, code_dir: Path | None = None, job_id: str | None = None,
                    now: datetime | None = None, hyperparameters: Mapping[str, Any] | None = None,
                    owner: str | None = None) -> Submission:
    """Check a spec the way the launcher will, before anything is uploaded: SpecInvalid names each problem's
    field (JobError: --id or --owner contradicts the spec).

    `code: ./src` in the spec means the same as --code ./src (relative to the spec's directory).
    hyperparameters (`submit --hp name=value`) override or add to the spec's, in the spec that is dropped.
    The drop goes to queue/<owner>/ for `owner` (--owner), else the spec's `owner:`, else to queue/ (owner
    default).
    """
    try:
        doc = load_document(text, spec_file.name)
    except SpecError as exc:
        raise SpecInvalid(str(spec_file), exc.errors) from None
    given = doc.get("hyperparameters")
    if hyperparameters and (given is None or isinstance(given, dict)):  # else validation names the field
        doc["hyperparameters"] = {**(given or {}), **hyperparameters}
    if code_dir is None and isinstance(doc.get("code"), str) and "://" not in doc["code"]:
        code_dir = (spec_file.parent / doc["code"]).resolve()
        if not code_dir.is_dir():
            raise SpecInvalid(str(spec_file), [FieldError("code", f"{doc['code']!r} is not a directory")])
    if code_dir is not None:  # validated with a stand-in now, set to the bundle's real URI on submit
        doc["code"] = URI_SCHEMES.get(str(doc.get("cloud", "aws")), "s3://") + "placeholder/code.tar.gz"
    drawn = not (job_id or doc.get("id"))
    job_id = job_id or doc.get("id") or readable_job_id(str(doc.get("name") or spec_file.stem), now or utcnow(),
                                                        secrets.token_hex(2))
    if doc.get("id") not in (None, job_id):
        raise JobError(f"--id {job_id!r} differs from the spec's id {doc['id']!r}")
    if owner and doc.get("owner") not in (None, owner):
        raise JobError(f"--owner {owner!r} differs from the spec's owner {doc['owner']!r}")
    owner = owner or doc.get("owner") or keys.DEFAULT_OWNER
    if owner != keys.DEFAULT_OWNER:
        doc["owner"] = owner
    try:
        parse_spec(yaml.safe_dump(doc), job_id=job_id, source=spec_file.name)
    except SpecError as exc:
        raise SpecInvalid(str(spec_file), exc.errors) from None
    return Submission(job_id, {**doc, "id": job_id}, code_dir, str(owner), drawn)


class AlreadyQueued(JobError):
    """The id is in queue/ already: nothing was uploaded or dropped."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} is already queued")
        self.job_id = job_id


def submit(backend: Backend, sub: Submission, on_bundle: Callable[[int, str], None] | None = None) -> JobView:
    """Upload the code bundle to code/<owner>/, then drop the spec into queue/ (queue/<owner>/), create-only.
    From then on the job exists. Both places are the owner's own, so IAM can confine a team to them.

    on_bundle(files, uri) is told what was uploaded. Returns the job as queued.
    """
    reg, job_id, doc = backend.reg, sub.job_id, dict(sub.doc)
    cloud = str(doc.get("cloud", "aws"))
    if not backend.url.startswith(URI_SCHEMES.get(cloud, "?")):  # the launcher would record it INVALID
        default = "" if "cloud" in doc else " (the default)"
        raise SpecInvalid(None, [FieldError("cloud", f"{cloud!r}{default} is not the cloud of the registry "
                                            f"{backend.url}: submit it to a registry on {cloud}, or set cloud: in "
                                            "the spec")])
    if reg.exists(job_id):
        raise JobExists(job_id)
    if _queued(reg, job_id) is not None:
        raise AlreadyQueued(job_id)
    if sub.code_dir is not None:
        with tempfile.TemporaryDirectory() as tmp:
            bundle = Path(tmp) / "code.tar.gz"
            files = make_bundle(sub.code_dir, bundle)
            backend.upload(keys.code_upload(sub.owner, job_id), bundle)
        doc["code"] = f"{backend.url}/{reg.key(keys.code_upload(sub.owner, job_id))}"
        if on_bundle:
            on_bundle(files, doc["code"])
    key, data = keys.queue_entry(job_id, sub.owner), yaml.safe_dump(doc, sort_keys=False).encode()
    try:
        reg.put_if_absent(key, data, "application/yaml")
    except PreconditionFailed:
        # a retry of a write whose answer was lost (a 5xx after it took effect) finds the drop it made itself
        if not _holds(reg, key, data):
            raise JobError(f"job {job_id!r} is already queued") from None
    return queued_view(job_id, key, data, utcnow())


def _holds(reg: Registry, key: str, data: bytes) -> bool:
    try:
        return reg.get_bytes(key) == data
    except NotFound:
        return False


def make_bundle(directory: Path, out: Path) -> int:
    """tar.gz of directory's contents (caches and VCS left out); returns the file count."""
    skip = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
    count = 0

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal count
        parts = Path(info.name).parts
        if any(p in skip for p in parts) or info.name.endswith(".pyc"):
            return None
        count += info.isfile()
        return info

    with tarfile.open(out, "w:gz") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return count


# ---- logs --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    attempt: int
    rank: int
    text: str


class LogReader:
    """A job's log chunks not read yet, in (attempt, rank, sequence) order; optionally one attempt / rank."""

    def __init__(self, reg: RootedStore, data: keys.JobData, attempt: int | None = None,
                 rank: int | None = None) -> None:
        self.reg, self.data, self.attempt, self.rank = reg, data, attempt, rank
        self.seen: set[str] = set()

    def new(self) -> list[Chunk]:
        chunks = []
        for attempt, rank, key in node_chunks(self.reg, "logs", self.data, self.attempt, self.rank):
            if key not in self.seen:
                chunks.append(Chunk(attempt, rank, self.reg.get_bytes(key).decode(errors="replace")))
                self.seen.add(key)
        return chunks


def node_chunks(reg: RootedStore, area: str, data: keys.JobData, attempt: int | None = None,
                rank: int | None = None) -> list[tuple[int, int, str]]:
    """(attempt, rank, key) of the chunks under the job's <area>/ (logs, metrics or system), in (attempt, rank,
    sequence) order; optionally one attempt and/or rank."""
    found: list[tuple[keys.NodeKey, str]] = []
    for key, _, _ in reg.listing(keys.node_prefix(area, data, attempt, rank if attempt is not None else None)):
        node = keys.parse_node_file(key, area)
        if node is not None and (rank is None or node.rank == rank):
            found.append((node, key))
    return [(node.attempt, node.rank, key) for node, key in sorted(found)]


def read_metrics(reg: RootedStore, data: keys.JobData, attempt: int | None = None,
                 rank: int | None = None) -> list[Sample]:
    """The metric samples the job's agents read from its output, in (attempt, rank, printed) order."""
    return [sample for a, r, key in node_chunks(reg, "metrics", data, attempt, rank)
            for sample in decode(reg.get_created(key), a, r)]


def read_system(reg: RootedStore, data: keys.JobData, attempt: int | None = None,
                rank: int | None = None) -> list[Sample]:
    """The system metric samples the job's agents took, in (attempt, rank, time) order."""
    return [sample for a, r, key in node_chunks(reg, "system", data, attempt, rank)
            for sample in sysmetrics.decode(reg.get_created(key), a, r)]


@dataclass(frozen=True)
class Checkpoint:
    """The newest checkpoint manifest in the bucket: what a next attempt would restore (of that rank)."""

    written_at: datetime  # when it reached the bucket
    rank: int
    attempt: int | None
    files: int
    step: int | None  # the training step the job's output showed when it was written, if any

    def describe(self, now: datetime) -> str:
        step = f", step {self.step}" if self.step is not None else ""
        return (f"newest {human_duration((now - self.written_at).total_seconds())} ago (rank {self.rank}, attempt"
                f" {self.attempt}, {self.files} files{step})")


def newest_checkpoint(reg: RootedStore, data: keys.JobData) -> Checkpoint | None:
    listed = [(when, key) for key, when, _ in reg.listing(keys.checkpoints_prefix(data) + "manifests/")
              if key.endswith(".json")]
    if not listed:
        return None
    when, key = max(listed)
    try:
        body = reg.get_json(key)
    except (NotFound, ValueError):  # replaced meanwhile, or not ours to read
        return None
    step = body.get("step")
    return Checkpoint(when, int(body.get("rank", 0)), body.get("attempt"), len(body.get("files", {})),
                      step if isinstance(step, int) else None)


# ---- artifacts ---------------------------------------------------------------------------------------------
ARTIFACT_MANIFEST = ".manifest.json"  # beside each area the agent publishes: artifacts/model.manifest.json


@dataclass(frozen=True)
class Artifact:
    """One file a job's agent uploaded when its process ended, as the area's manifest names it: the model
    directory (SM_MODEL_DIR) as model/, output/data as output/, a rank other than 0's under rank-<n>/."""

    path: str  # relative to the job's artifacts: model/result.json, rank-1/output/log.txt
    size: int
    version: str  # the object's version when it was uploaded (a download checks it)
    key: str  # the object's registry key
    written_at: datetime | None  # when its manifest was written


def artifacts(reg: RootedStore, data: keys.JobData) -> list[Artifact]:
    """Every artifact the job's manifests name, by path. An area whose manifest is missing (its upload did not
    finish) or does not parse has none."""
    base = keys.artifacts_prefix(data)
    found = []
    for key, _, _ in reg.listing(base):
        if not key.endswith(ARTIFACT_MANIFEST):
            continue
        area = key[len(base):-len(ARTIFACT_MANIFEST)]
        try:
            body = reg.get_json(key)
            files = dict(body["files"])
            written = datetime.fromisoformat(body["written_at"]) if body.get("written_at") else None
        except (NotFound, ValueError, KeyError, TypeError):
            continue
        for rel, entry in files.items():
            try:
                found.append(Artifact(f"{area}/{rel}", int(entry["size"]), str(entry.get("version") or ""),
                                      f"{base}{area}/{entry.get('key') or rel}", written))
            except (KeyError, TypeError, ValueError):
                continue
    return sorted(found, key=lambda a: a.path)


def download(reg: RootedStore, wanted: Iterable[Artifact], dest: Path) -> list[Path]:
    """Each artifact to dest/<its path>, checked against the version its manifest names. A path that would land
    outside dest (the manifest is the job's own writing) is refused before anything is downloaded."""
    root = dest.resolve()
    planned = [(a, root / a.path) for a in wanted]
    for artifact, path in planned:
        if not path.resolve().is_relative_to(root):
            raise JobError(f"artifact {artifact.path!r} would be written outside {dest}: not downloaded")
    for artifact, path in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        store, key = reg.location(artifact.key)
        try:
            store.download_file(key, path, version=artifact.version or None, size=artifact.size)
        except (NotFound, PreconditionFailed):
            raise JobError(f"artifact {artifact.path} was replaced or deleted since its manifest was read; list "
                           "the artifacts again") from None
    return [path for _, path in planned]


# ---- following ---------------------------------------------------------------------------------------------
class Goal(StrEnum):
    RUNNING = "running"  # RUNNING, or already past it (terminal)
    TERMINAL = "terminal"


DRAIN_TIMEOUT = 60.0  # after the job ends, how long to wait for its agents' last chunks


def reached(goal: Goal, state: State) -> bool:
    return state in TERMINAL or (goal == Goal.RUNNING and state == State.RUNNING)


class WaitTimedOut(JobError):
    def __init__(self, view: JobView, goal: Goal, waited: float) -> None:
        super().__init__(f"timed out after {waited:.0f}s waiting for {view.id} to be {goal}: it is {view.state}"
                         + (f" ({view.reason})" if view.reason else ""))
        self.view, self.goal, self.waited = view, goal, waited


@dataclass
class Follow:
    """What to do while following: where status lines and chunks go, how often to look, for how long."""

    on_status: Callable[[Status], None]
    on_chunk: Callable[[Chunk], None] | None = None
    logs: LogReader | None = None
    compute: ComputeFactory | None = None  # to tell when a finished job's instances are gone
    interval: float = 1.0
    timeout: float | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], datetime] = utcnow


def follow(reg: Registry, job_id: str, goal: Goal, how: Follow) -> JobView:
    """Poll the job until it reaches goal, reporting its status (and new log chunks, to how.on_chunk) on the
    way; the view that reached the goal is returned, not reported. See following()."""
    steps = following(reg, job_id, goal, how)
    while True:
        try:
            chunk = next(steps)
        except StopIteration as done:
            view: JobView = done.value
            return view
        if how.on_chunk is not None:
            how.on_chunk(chunk)


def following(reg: Registry, job_id: str, goal: Goal, how: Follow) -> Generator[Chunk, None, JobView]:
    """follow() as a generator: yields the new log chunks (with how.logs) as they come, reports the status to
    how.on_status on each poll, and returns the view that reached the goal.

    JobNotFound if it does not exist (neither recorded, queued nor rejected); WaitTimedOut past how.timeout.
    With logs, a finished job is drained: its last chunks land just before its agents' exit reports.
    """
    started = how.clock()
    view = find(reg, job_id)
    while True:
        yield from _new(how)
        if reached(goal, view.state):
            break
        how.on_status(status(view, how.now()))
        waited = how.clock() - started
        if how.timeout is not None and waited >= how.timeout:
            raise WaitTimedOut(view, goal, waited)
        how.sleep(how.interval if how.timeout is None else min(how.interval, how.timeout - waited))
        view = find(reg, job_id)
    if how.logs is not None and view.terminal:
        deadline = how.clock() + DRAIN_TIMEOUT
        compute = how.compute() if how.compute else None
        while not drained(reg, view.record, compute) and how.clock() < deadline:
            yield from _new(how)
            how.sleep(how.interval)
        yield from _new(how)
    return view


def _new(how: Follow) -> list[Chunk]:
    return how.logs.new() if how.logs is not None else []


def drained(reg: Registry, record: JobRecord | None, compute: Compute | None) -> bool:
    """No more output will come: every node of the last attempt has reported its exit (an agent's final log
    chunk lands before its report), or none of its instances is alive any more."""
    if record is None or not record.instances:
        return True
    reports = [k for k, _, _ in reg.listing(keys.exits_prefix(record.id, record.attempt)) if k.endswith("/exit.json")]
    if len(reports) >= len(record.instances):
        return True
    if compute is None:
        return False
    alive = {i.id for i in compute.list_managed() if i.state in ("pending", "running")}
    return not alive.intersection(record.instances)
