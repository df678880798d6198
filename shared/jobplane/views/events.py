"""A job's events as a person reads them (`describe`): one line each, the kind, the time and the fields that
matter, in words; not the raw JSON a record keeps (`describe --json` has that)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HIDDEN = ("time", "kind", "spec", "from", "to", "attempt", "reason", "cause")  # said another way, or too long


def value_text(value: Any) -> str:
    """A field's value as words: a list joined by commas, a mapping as k=v, a number as it reads."""
    if isinstance(value, list | tuple):
        return ", ".join(value_text(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={value_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value)


def event_line(event: Mapping[str, Any], launched: set[int]) -> tuple[str, str, str]:
    """(time, kind, what happened) for one event. launched: the attempts that got VMs, so a claim of an attempt
    that never launched (the job waited, or ended before) says so instead of reading as a launch."""
    when = str(event.get("time", ""))[:19].replace("T", " ")
    kind = str(event.get("kind", ""))
    words: list[str] = []
    if "from" in event and "to" in event:
        words.append(f"{event['from']} -> {event['to']}")
    reason, attempt = str(event.get("reason") or ""), event.get("attempt")
    if isinstance(attempt, int) and attempt > 0 and "to" in event and f"attempt {attempt}" not in reason:
        words.append(f"attempt {attempt}")
    if reason:
        words.append(reason)
    if event.get("to") == "LAUNCHING" and attempt not in launched:
        words[-1] += " (no VM launched)"
    words += [f"{k.replace('_', ' ')} {value_text(v)}" for k, v in event.items() if k not in HIDDEN and v is not None]
    return when, kind, "; ".join(words)


def launched_attempts(usage: Iterable[Any], events: Iterable[Mapping[str, Any]]) -> set[int]:
    """The attempts that got VMs: those with usage (a record's usage is per launched attempt), and those an event
    shows instances for or running."""
    return {u.attempt for u in usage} | {int(e["attempt"]) for e in events if isinstance(e.get("attempt"), int)
                                         and (e.get("instances") or e.get("to") == "RUNNING")}
