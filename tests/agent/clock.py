"""The agent's Clock (jobplane.agent.clock) for tests: time moves only when the test, or the agent's main thread,
waits or says so. Nothing sleeps.

It is jobplane.clouds.memory.Clock, the clock day tests step ("12:31") and share with MemoryStore, with the rest
of the agent's Clock: a monotonic reading that moves with it, and waits that pass time instead of spending it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from jobplane.clouds.memory import Clock

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class ManualClock(Clock):
    """A wait or a sleep in the driving thread (the one that made the clock: the test's, and the agent's main
    thread when the test calls Agent.run) moves the clock on by its timeout at once, unless the event is already
    set. A wait in any other thread (the agent's background and checkpoint threads) lasts until its event is set
    or the driving thread has moved the clock past its end, so those threads run at the times they would, in
    between the driver's steps. A sleep moves the clock on at once in any thread: it waits for nothing."""

    def __init__(self, start: datetime = START) -> None:
        super().__init__(start)
        self.start = start  # monotonic() is the seconds since
        self._moved = threading.Condition()
        self.driver = threading.get_ident()
        self.waits: list[float] = []  # the timeout of every wait and sleep that moved the clock, in order

    def monotonic(self) -> float:
        return (self.now - self.start).total_seconds()

    def advance(self, seconds: float) -> datetime:
        with self._moved:
            now = super().advance(seconds)
            self._moved.notify_all()
        return now

    def at(self, hhmm: str) -> datetime:
        with self._moved:
            now = super().at(hhmm)
            self._moved.notify_all()
        return now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        if threading.get_ident() == self.driver:
            self.sleep(timeout)
            return event.is_set()
        end = self.monotonic() + timeout
        with self._moved:
            while not event.is_set() and self.monotonic() < end:
                self._moved.wait(0.01)  # an Event tells no one it was set: look again soon
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        with self._moved:
            self.waits.append(seconds)
            self.advance(max(0.0, seconds))
