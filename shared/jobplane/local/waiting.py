"""The one way the local cloud, the demo and the tests wait: on a condition, with a deadline, and a failure that
says what was awaited and what was last seen (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time (an AssertionError, so pytest reports it as a failed check)."""


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, every: float = 0.2, *,
             abort: Callable[[], str | None] | None = None) -> T:
    """Poll check() until it returns something truthy, and return that. Past the deadline, raise WaitTimeout
    naming what was awaited and what check() returned last; at once if abort() gives a reason (a process that
    died, say), which the message carries."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        reason = abort() if abort is not None else None
        if reason or time.monotonic() > deadline:
            why = reason or f"timed out after {timeout:.0f}s"
            raise WaitTimeout(f"{why} waiting for {what} (last seen: {value!r})")
        time.sleep(every)
