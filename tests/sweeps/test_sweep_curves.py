"""A trial's objective curve is read incrementally (jobplane.sweeps.curves): each run GETs only the metric chunks
written since the last, a rerun's attempt is read after the first one's (a step printed again takes the later
attempt's value), and once the trial has ended with its last chunk in, nothing of its metrics is read again."""

from __future__ import annotations

from collections.abc import Iterator

from jobplane.clouds.base import Blob, ObjectInfo
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore
from jobplane.model import keys
from jobplane.store.registry import Registry
from jobplane.sweeps import curves
from tests.control.reconcile.day import MORNING, Day
from tests.helpers import publish_agent_manifest
from tests.sweeps.helpers import prints


class Watched(MemoryStore):
    """Counts the GETs of metric chunks and the listings of metrics/ prefixes."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.chunk_gets = self.metric_lists = 0

    def get(self, key: str) -> Blob:
        self.chunk_gets += "/metrics/" in key
        return super().get(key)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        self.metric_lists += "/metrics/" in prefix
        return super().list(prefix, page_size)


def counted(store: Watched) -> tuple[int, int]:
    seen = store.chunk_gets, store.metric_lists
    store.chunk_gets = store.metric_lists = 0
    return seen


def test_a_curve_is_read_chunk_by_chunk_once_and_not_at_all_once_complete() -> None:
    clock = Clock(MORNING)
    store = Watched(clock)
    day = Day(clock, store, MemoryCompute(clock, boot=60, shutdown=60), Registry(store))
    publish_agent_manifest(day.reg, "aws")
    day.started("t", "spot: true\n")

    def read() -> tuple[curves.Curve, float | None]:
        return curves.read(day.reg, "s", "t", "loss", clock())

    assert read() == ((), None) and counted(store) == (0, 1)  # no chunk yet
    prints(day, "t", {10: 0.9, 20: 0.8}, seq=0)
    assert read() == (((10, 0.9), (20, 0.8)), 0.8) and counted(store) == (1, 1)
    prints(day, "t", {30: 0.7}, seq=1)
    assert read() == (((10, 0.9), (20, 0.8), (30, 0.7)), 0.7) and counted(store) == (1, 1)  # the new chunk only
    assert read()[1] == 0.7 and counted(store) == (0, 1)

    day.preempted("t")
    day.rerun()
    clock.advance(60)
    day.beat("t")
    day.sweeper()
    prints(day, "t", {30: 0.65, 40: 0.6}, seq=0)  # attempt 2 resumed from its step-20 checkpoint
    assert read() == (((10, 0.9), (20, 0.8), (30, 0.65), (40, 0.6)), 0.6)
    assert counted(store) == (1, 2)  # attempt 1 looked at once more, then attempt 2's chunk
    day.exits("t", 0, 0)
    day.sweeper()
    assert day.job("t").state == "SUCCEEDED"
    assert read()[1] == 0.6 and counted(store) == (0, 1)  # ended after its exit report: complete now
    assert read()[1] == 0.6 and counted(store) == (0, 0)  # and never read again
    assert day.reg.get_json(keys.sweep_curve("s", "t"))["complete"] is True
