"""The agent's clock: every time the agent reads or waits for goes through one, as the reconcilers take `now`.

Its shape is jobplane.clouds.memory.Clock's, the clock day tests share between MemoryStore and MemoryCompute:
calling it gives the wall time (aware, UTC), so it can be passed wherever a `Callable[[], datetime]` is taken
(OutputLog, CheckpointSync, MemoryStore). The agent adds a monotonic reading for intervals and deadlines, and
waits. SYSTEM is the real one; tests drive a manual one (tests/agent/clock.py) step by step.

What the clock does not cover is the time of what the agent only observes: a user process's exit and its
grace (Popen.wait), file mtimes (the settle rule, the cut after a kill), and the thread pools that move files
(their deadlines and timings, agent/transfer.py and checkpoints.py; their retries pause with the clock's sleep).
Those run in the machine's time.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> datetime:
        """The wall time, aware (UTC): what the records the agent writes say."""
        ...

    def monotonic(self) -> float:
        """Seconds, for intervals and deadlines: never runs backwards."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """event.wait(timeout): True as soon as the event is set, False once timeout seconds have passed."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's clock."""

    def __call__(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM = SystemClock()
