"""What a job's facts can cost a check is bounded (issue 57), over a day in memory: a check reads at most one exit
report per node of the attempt and a boot failure, each no larger than records.MAX_FACT_BYTES (the listing's size
says, before any GET), and a preempted marker only within that bound too. Whatever else a job writes under its
attempt (ranks past its nodes, keys no writer makes, objects over the bound) is one ignored fact, its event
recorded once, and never read. On the code before, 2,000 forged exit reports and a 32 MB one cost every check of
the job 2,001 GETs, 32 MB and 2,001 events."""

from __future__ import annotations

import builtins
from collections.abc import Iterator

import pytest

from jobplane.clouds.base import Blob
from jobplane.clouds.memory import Clock, MemoryStore
from jobplane.model import keys, records
from jobplane.model.states import State
from tests.control.reconcile.day import Day, new_day

FORGED_RANKS = 2000
BIG = 32 << 20


class Reads(MemoryStore):
    """The in-memory store, noting the key and the size of every GET."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.got: builtins.list[tuple[str, int]] = []

    def get(self, key: str) -> Blob:
        blob = super().get(key)
        self.got.append((key, len(blob.data)))
        return blob


@pytest.fixture
def day() -> Iterator[Day]:
    yield new_day(Reads)


def reads(day: Day, prefix: str) -> list[tuple[str, int]]:
    store = day.store
    assert isinstance(store, Reads)
    return [(key, size) for key, size in store.got if key.startswith(day.reg.key(prefix))]


def ignored(day: Day, job_id: str) -> list[dict[str, object]]:
    return [e for e in day.reg.events(job_id) if e["kind"] == "ignored-fact"]


def test_forged_exit_reports_cost_a_check_no_more_than_one_bounded_read_per_node(day: Day) -> None:
    day.started("j")
    attempt = day.job("j").attempt
    day.at("12:05")
    for rank in range(1, FORGED_RANKS + 1):  # every VM may write any job's facts: none names an instance of j
        day.reg.put_json(keys.exit_report("j", attempt, rank), records.ExitReport(code=0, instance_id="i-x").body())
    day.reg.put(keys.exit_report("j", attempt, 0), b"{" + b" " * BIG + b"}")
    day.reg.put(keys.attempt_prefix("j", attempt) + "notes.txt", b"anything")
    day.beat("j")
    store = day.store
    assert isinstance(store, Reads)

    for _ in range(2):  # the exit reports' events name the job: the check reads it closely, twice
        store.got.clear()
        day.sweeper(jobs=["j"])
        got = reads(day, keys.attempt_prefix("j", attempt))
        assert len(got) <= day.job("j").spec.num_nodes + 1, got[:3]
        assert sum(size for _, size in got) <= (day.job("j").spec.num_nodes + 1) * records.MAX_FACT_BYTES
        assert day.job("j").state == State.RUNNING
    events = ignored(day, "j")
    assert len(events) == 1, [e["key"] for e in events[:3]]
    assert events[0]["key"] == keys.attempt_prefix("j", attempt)
    assert f"{FORGED_RANKS} exit reports of ranks past the attempt's 1 node" in str(events[0]["why"])

    day.at("12:10")
    day.exits("j", 0, 0)  # the agent's own report replaces the oversized one
    store.got.clear()
    day.sweeper(jobs=["j"])
    assert [key for key, _ in reads(day, keys.attempt_prefix("j", attempt))] == [
        day.reg.key(keys.exit_report("j", attempt, 0))]
    assert day.job("j").state == State.SUCCEEDED
    assert len(ignored(day, "j")) == 1


def test_an_oversized_preempted_marker_is_never_read_and_noted_once(day: Day) -> None:
    day.started("j")
    day.at("12:05")
    day.reg.put(keys.preempted_marker("j"), b"{" + b" " * BIG + b"}")
    day.beat("j")
    store = day.store
    assert isinstance(store, Reads)
    store.got.clear()
    day.sweeper(jobs=["j"])
    day.rerun()
    assert reads(day, keys.preempted_marker("j")) == []
    assert day.job("j").state == State.RUNNING and day.reg.preempted() == {}
    assert len(ignored(day, "j")) == 1
