"""What a Client and the handles it gives out (Job, Sweep, Watch) share: the registry its Settings name, connected
on first use, and that cloud's Compute adapter, made once. A connection may be shared by threads."""

from __future__ import annotations

import threading

from jobplane.clouds.base import Compute
from jobplane.ops import backend, jobs
from jobplane.sdk.errors import translated
from jobplane.settings import Settings
from jobplane.store.registry import Registry


class Connection:
    def __init__(self, settings: Settings, progress: backend.Progress = backend.no_progress,
                 connected: jobs.Backend | None = None) -> None:
        """connected: the registry and its cloud's adapters already built (an in-memory registry in tests and
        benchmarks), used instead of connecting on first use."""
        self.settings, self.progress = settings, progress
        self._lock = threading.Lock()
        self._backend = connected
        self._adapter: Compute | None = None

    def backend(self) -> jobs.Backend:
        with self._lock:
            if self._backend is None:
                self._backend = backend.connect(self.settings, self.progress)
            return self._backend

    @property
    def registry(self) -> Registry:
        return self.backend().reg

    def compute(self) -> Compute:
        """The deployment's Compute adapter, made once (its SDK client is not made safely by two threads)."""
        made = self.backend()
        with self._lock:
            if self._adapter is None:
                with translated():
                    self._adapter = made.compute()
            return self._adapter
