"""The wall clock, in UTC: the one `utcnow` every entry point, operation and page asks for the time (a run's decisions
take the `now` they are given, so a test hands them a manual clock)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
