"""The user process's output: echoed to the agent's console as it arrives, buffered for log chunks, and read
for metric points and stop rules (jobplane.model.metrics) on the way. With the job's secret values given
(`redact_with`), all of it is redacted first (jobplane.agent.redact): the console, the chunks, the points, the last
line an exit report may quote."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import BinaryIO

from jobplane.agent.redact import Redactor
from jobplane.model import metrics


class OutputLog:
    """Thread-safe: the pump thread writes, the shipping thread takes."""

    def __init__(self, console: BinaryIO | None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._console = console
        self._clock = clock  # the wall time of each line (the agent's clock)
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._points: list[bytes] = []  # encoded metric points, one JSON line each
        self._extractor = metrics.Extractor(metrics=())  # until watch(): `step N` for the heartbeat only
        self._on_stop: Callable[[str], None] | None = None
        self.last_output_at: datetime | None = None  # last line from the user process
        self.step: int | None = None  # the last one seen goes into the heartbeat
        self._output_seq = 0  # bumps on every user line; the output mark compares it
        self.last_line = ""  # the last line printed: why a tool the agent ran failed, for the exit report
        self.redactor = Redactor(())

    def redact_with(self, values: list[bytes]) -> None:
        """Redact these values from now on (before the user process starts: nothing printed before held them)."""
        with self._lock:
            self.redactor = Redactor(values)

    def watch(self, extractor: metrics.Extractor, on_stop: Callable[[str], None]) -> None:
        """Read the job's metrics with extractor from now on; on_stop(why) is called, from the thread that
        reads the output, on the line that matched a stop rule (once per line that does)."""
        with self._lock:
            self._extractor, self._on_stop = extractor, on_stop

    def user(self, line: bytes) -> None:
        """A line the user process printed."""
        now = self._clock()
        with self._lock:
            extractor, on_stop, redactor = self._extractor, self._on_stop, self.redactor
            shown = redactor.feed(line)  # a value cut across lines is whole here; the chunks get this stream
        text = redactor.redact(line).decode(errors="replace")
        points, stop = extractor.line(text)  # one pump thread at a time calls this
        with self._lock:
            self._pending.append(shown)
            self.last_output_at = now
            self._output_seq += 1
            self.last_line = text.strip()
            self.step = extractor.step
            self._points += [metrics.encode(p, now) for p in points]
        self._echo(shown)
        if stop is not None and on_stop is not None:
            on_stop(stop)

    def note(self, text: str) -> None:
        """A line from the agent itself (kept in the job's logs, not counted as user output)."""
        with self._lock:  # what the user's output held back ends here: a note is never part of a value
            line = self.redactor.flush() + self.redactor.redact(
                f"[jobplane-agent {self._clock():%H:%M:%S}] {text}\n".encode())
            self._pending.append(line)
        self._echo(line)

    @property
    def output_seq(self) -> int:
        with self._lock:
            return self._output_seq

    def take(self) -> bytes:
        with self._lock:
            data, self._pending = b"".join(self._pending), []
        return data

    def give_back(self, data: bytes) -> None:
        """Put back a chunk whose upload failed, ahead of anything written since."""
        with self._lock:
            self._pending.insert(0, data)

    def take_points(self) -> list[bytes]:
        with self._lock:
            points, self._points = self._points, []
        return points

    def give_back_points(self, points: list[bytes]) -> None:
        with self._lock:
            self._points[:0] = points

    def _echo(self, line: bytes) -> None:
        if self._console is None:
            return
        try:
            self._console.write(line)
            self._console.flush()
        except (OSError, ValueError):
            pass  # a closed console must not stop the job
