"""A node's GPU utilization averaged over the policy's window, so the sweeper can see idle GPUs in a listing.

The agent feeds it one reading per heartbeat while the user's `run` command runs (setup and installs are
expected to leave GPUs idle) and, while the mean over a full window is under the threshold, rewrites the
rank's `.idle` mark with the heartbeat. A reading of None (no nvidia-smi, no GPU) or a phase change starts
the window over: a node is idle only after a whole window of low readings.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class IdleMeter:
    window: float  # seconds
    threshold: float  # percent
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (monotonic time, utilization)
    since: float | None = None  # the first reading of the current unbroken run of readings

    def add(self, at: float, utilization: float | None) -> None:
        if utilization is None:
            self.samples.clear()
            self.since = None
            return
        if self.since is None:
            self.since = at
        self.samples.append((at, utilization))
        while self.samples and self.samples[0][0] < at - self.window:
            self.samples.popleft()

    @classmethod
    def watching(cls, window: float | None, threshold: float | None) -> IdleMeter | None:
        """The meter cluster.json's idle-GPU watch asks for (its window and threshold); None when there is none."""
        return cls(window, threshold) if window and threshold is not None else None

    def idle(self, at: float) -> float | None:
        """The mean utilization over the window when it is under the threshold and the readings cover the whole
        window; None otherwise."""
        if self.since is None or at - self.since < self.window or not self.samples:
            return None
        mean = sum(u for _, u in self.samples) / len(self.samples)
        return mean if mean < self.threshold else None
