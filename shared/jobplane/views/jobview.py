"""What `jobplane ls`, `describe` and `logs -f` show: plain rows and status lines built from job records,
drops still in queue/ and rejected drops (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobplane.model import keys
from jobplane.model.states import TERMINAL, State
from jobplane.views import cost

if TYPE_CHECKING:  # annotations only: `jobplane --help` and `ls`'s import build no model
    from jobplane.model.jobrecord import JobRecord
    from jobplane.model.spec import JobSpec

COLUMNS = ("id", "state", "attempt", "nodes", "instance_type", "spot", "age", "runtime", "cost", "restarts",
           "reason")
HEADERS = {"cost": "EST. COST"}  # every cost is an estimate (jobplane.views.cost); the header says so


def header(col: str) -> str:
    return HEADERS.get(col, col.upper().replace("_", " "))


def human_size(size: float) -> str:
    """Bytes as people read them: 512 B, 2.0 KB, 1.5 GB."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def runtime_seconds(record: JobRecord, now: datetime) -> float | None:
    """Time since the first launch, frozen once the job is terminal."""
    if record.first_launched_at is None:
        return None
    end = record.state_since if record.terminal else now
    return (end - record.first_launched_at).total_seconds()


def held(record: JobRecord, now: datetime) -> str | None:
    """A FAILED attempt's debug hold, as `describe` shows it: until when its VMs are kept, or that it is over."""
    until = record.held_until
    if until is None:
        return None
    when = f"held until {until:%Y-%m-%d %H:%M:%S} UTC"
    if not record.held(now):
        return f"{when} (over: its VMs are terminated by the next check, if not already)"
    return f"{when} ({human_duration((until - now).total_seconds())} left): `jobplane ssh {record.id}` to look"


@dataclass(frozen=True)
class JobView:
    """A job as a user sees it: its record; or, before the launcher has recorded it, its drop in queue/
    (state QUEUED) or its rejection (state INVALID)."""

    id: str
    state: State
    since: datetime  # created (a record), dropped into queue/ (a drop) or rejected
    spec: JobSpec | None = None  # None for a drop the launcher will reject, and for a rejection
    record: JobRecord | None = None
    reason: str | None = None
    drop: str | None = None  # the queue/ key, while the job is only a drop

    @classmethod
    def of(cls, record: JobRecord) -> JobView:
        return cls(record.id, record.state, record.created_at, record.spec, record, record.reason)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def attempt(self) -> int:
        return self.record.attempt if self.record else 0

    @property
    def owner(self) -> str:
        """Whose job it is: its record's owner, else its spec's, else its drop's folder's (a drop the launcher will
        reject), else the default owner's (a rejection)."""
        if self.record is not None:
            return self.record.owner
        if self.spec is not None:
            return self.spec.owner
        drop = keys.parse_drop(self.drop) if self.drop else None
        return drop.owner if drop else keys.DEFAULT_OWNER

    @property
    def num_nodes(self) -> int:
        return self.spec.num_nodes if self.spec else 1


# Each column from a record, on its own: a table of thousands sorts by one column and builds the whole row only
# for the rows it shows (age, runtime and cost move with the clock, so no row is kept between views).
_RECORD_CELLS: dict[str, Callable[[JobRecord, datetime], Any]] = {
    "id": lambda record, now: record.id,
    "state": lambda record, now: str(record.state),
    "attempt": lambda record, now: record.attempt,
    "nodes": lambda record, now: record.spec.num_nodes,
    "instance_type": lambda record, now: record.instance_type or ",".join(record.spec.instance_types),
    "spot": lambda record, now: record.spec.uses_spot,
    "age": lambda record, now: (now - record.created_at).total_seconds(),
    "runtime": lambda record, now: runtime_seconds(record, now),
    "cost": lambda record, now: cost_usd(record, now),
    "restarts": lambda record, now: record.restarts,
    "reason": lambda record, now: record.reason or "",
}


def job_row(record: JobRecord, now: datetime) -> dict[str, Any]:
    return {col: cell(record, now) for col, cell in _RECORD_CELLS.items()}


def cost_usd(record: JobRecord, now: datetime) -> float | None:
    """The job's estimated cost so far in USD; None when it launched nothing, or nothing it ran has a price."""
    spent = cost.job_cost(record, now)
    return None if not record.usage or (spent.unpriced and not spent.usd) else round(spent.usd, 6)


def _unrecorded_row(view: JobView, now: datetime) -> dict[str, Any]:
    """A job still in queue/ (age = time waited there) or rejected."""
    spec = view.spec
    return {"id": view.id, "state": str(view.state), "attempt": 0, "nodes": spec.num_nodes if spec else None,
            "instance_type": ",".join(spec.instance_types) if spec else "", "spot": spec.uses_spot if spec else None,
            "age": (now - view.since).total_seconds(), "runtime": None, "cost": None, "restarts": 0,
            "reason": view.reason or ""}


def view_row(view: JobView, now: datetime) -> dict[str, Any]:
    """A row for any job: recorded, still in queue/ or rejected."""
    return job_row(view.record, now) if view.record is not None else _unrecorded_row(view, now)


def view_cell(view: JobView, col: str, now: datetime) -> Any:
    """One column of view_row (KeyError for no such column), computing only that one for a recorded job."""
    if view.record is not None:
        return _RECORD_CELLS[col](view.record, now)
    return _unrecorded_row(view, now)[col]  # drops and rejections are few: their row is cheap


def rejected_reason(error_doc: Any) -> str:
    """One line from rejected/<id>.error.json, whatever detail it carries."""
    if not isinstance(error_doc, dict):
        return str(error_doc)
    if error_doc.get("reason"):
        return str(error_doc["reason"])
    errors = error_doc.get("errors")
    if isinstance(errors, list) and errors:
        return "; ".join(f"{e['field']}: {e['message']}" if isinstance(e, dict) and "field" in e else str(e)
                         for e in errors)
    return str(error_doc.get("error") or error_doc.get("message") or "rejected")


def rejected_row(job_id: str, error_doc: Any, rejected_at: datetime, now: datetime) -> dict[str, Any]:
    return view_row(JobView(job_id, State.INVALID, rejected_at, reason=rejected_reason(error_doc)), now)


@dataclass(frozen=True)
class Status:
    """One line about where a job is. `phase` changes only when something a user cares about does (not
    each second a wait grows), so a log that is not a terminal gets one line per change."""

    phase: str
    text: str


def status(view: JobView, now: datetime) -> Status:
    """queued 3s -> launching attempt 1 -> running attempt 1 on i-... -> SUCCEEDED."""
    record, state = view.record, view.state
    waited = human_duration((now - view.since).total_seconds())
    if record is None or state == State.QUEUED:
        if state == State.INVALID:
            return Status("INVALID", f"INVALID: {view.reason or 'rejected'}")
        return Status("queued", f"queued {waited}: waiting for the launcher")
    attempt = record.attempt
    on = ", ".join(record.instances)
    since = human_duration((now - record.state_since).total_seconds())
    if state == State.LAUNCHING:
        if not on:
            return Status(f"launching {attempt}", f"launching attempt {attempt}")
        return Status(f"booting {attempt}", f"launching attempt {attempt} on {on}: waiting for the first "
                                            f"heartbeat ({since})")
    if state == State.RUNNING:
        return Status(f"running {attempt}", f"running attempt {attempt} on {on}")
    if state == State.WAITING_CAPACITY:
        retry = f", next try in {human_duration((record.wait_until - now).total_seconds())}" \
            if record.wait_until else ""
        return Status(f"waiting {attempt}.{record.waits}", f"waiting for capacity{retry}: {record.reason}")
    if state == State.PREEMPTED:
        return Status(f"preempted {attempt}", f"attempt {attempt} preempted ({since} ago): {record.reason}")
    return Status(str(state), f"{state}" + (f": {record.reason}" if record.reason else ""))


def display(row: dict[str, Any]) -> list[str]:
    """The row as table cells."""
    def cell(col: str) -> str:
        value = row[col]
        if col in ("age", "runtime"):
            return human_duration(value)
        if col == "cost":
            return cost.money(cost.Cost(usd=value)) if value is not None else "-"
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return str(value)
    return [cell(c) for c in COLUMNS]


def readable_job_id(name: str, now: datetime, suffix: str) -> str:
    """'My Model v2' at 2026-11-22 11:30:05 -> 'my-model-v2-1122-113005-<suffix>' (a valid job id)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = "job-" + slug
    slug = slug[:40].rstrip("-")
    return f"{slug}-{now:%m%d-%H%M%S}-{suffix}"
