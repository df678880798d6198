"""What `jobplane ls` and `describe` show: plain rows built from job records and rejected drops (no I/O)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from jobplane.registry import JobRecord
from jobplane.states import State

COLUMNS = ("id", "state", "attempt", "nodes", "instance_type", "spot", "age", "runtime", "restarts", "reason")


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


def job_row(record: JobRecord, now: datetime) -> dict[str, Any]:
    spec = record.spec
    return {
        "id": record.id,
        "state": str(record.state),
        "attempt": record.attempt,
        "nodes": spec.num_nodes,
        "instance_type": record.instance_type or ",".join(spec.instance_types),
        "spot": spec.spot,
        "age": (now - record.created_at).total_seconds(),
        "runtime": runtime_seconds(record, now),
        "restarts": record.restarts,
        "reason": record.reason or "",
    }


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
    return {"id": job_id, "state": str(State.INVALID), "attempt": 0, "nodes": None, "instance_type": "",
            "spot": None, "age": (now - rejected_at).total_seconds(), "runtime": None, "restarts": 0,
            "reason": rejected_reason(error_doc)}


def display(row: dict[str, Any]) -> list[str]:
    """The row as table cells."""
    def cell(col: str) -> str:
        value = row[col]
        if col in ("age", "runtime"):
            return human_duration(value)
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
