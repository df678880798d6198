"""The user process's output: echoed to the agent's console as it arrives, buffered for log chunks."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime
from typing import BinaryIO

# "step 120", "Step: 120", "step=120", "global_step 120": the last one seen goes into the heartbeat
_STEP = re.compile(rb"\bstep\b\s*[:=]?\s*(\d+)", re.IGNORECASE)


class OutputLog:
    """Thread-safe: the pump thread writes, the shipping thread takes."""

    def __init__(self, console: BinaryIO | None) -> None:
        self._console = console
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self.last_output_at: datetime | None = None  # last line from the user process
        self.step: int | None = None
        self._output_seq = 0  # bumps on every user line; the output mark compares it

    def user(self, line: bytes) -> None:
        """A line the user process printed."""
        match = _STEP.search(line)
        with self._lock:
            self._pending.append(line)
            self.last_output_at = datetime.now(UTC)
            self._output_seq += 1
            if match:
                self.step = int(match.group(1))
        self._echo(line)

    def note(self, text: str) -> None:
        """A line from the agent itself (kept in the job's logs, not counted as user output)."""
        line = f"[jobplane-agent {datetime.now(UTC):%H:%M:%S}] {text}\n".encode()
        with self._lock:
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

    def _echo(self, line: bytes) -> None:
        if self._console is None:
            return
        try:
            self._console.write(line)
            self._console.flush()
        except (OSError, ValueError):
            pass  # a closed console must not stop the job
