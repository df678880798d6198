"""What a check lists (tests/control/reconcile/day.py, the manual clock): healthy RUNNING jobs cost it the listings of
active/, heartbeats/ and admission/ and no job.json GET, their limits riding in their markers' names (preempted-jobs/
is listed only when a job is read or PREEMPTED); and a registry written before the limits, the idle flags and the
held-until keys moved out of limits/ is still read right (limits/ listed only while something needs it), and moved
on."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from datetime import timedelta

import pytest

from jobplane.clouds.base import Blob, ObjectInfo
from jobplane.clouds.memory import Clock, MemoryStore
from jobplane.control import reconcile
from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.states import State
from tests.control.reconcile.day import MORNING, Day, new_day, rules


class Taps(MemoryStore):
    """The in-memory store, noting the prefix of every listing page and the key of every GET."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.listed: builtins.list[str] = []
        self.got: builtins.list[str] = []

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        self.listed.append(prefix)
        return super().list(prefix, page_size)

    def get(self, key: str) -> Blob:
        self.got.append(key)
        return super().get(key)


@pytest.fixture
def day() -> Iterator[Day]:
    yield new_day(Taps)


def check(day: Day) -> tuple[list[reconcile.Outcome], list[str], list[str]]:
    """One scheduled check: what it did, the prefixes it listed and the keys it read."""
    taps = day.store
    assert isinstance(taps, Taps)
    ctx = day.context()
    taps.listed.clear()
    taps.got.clear()
    done = reconcile.check(ctx, now=day.clock())
    return done, sorted(set(taps.listed)), taps.got


def test_healthy_jobs_cost_a_check_no_limits_listing_and_no_record(day: Day) -> None:
    for job_id in ("a", "b", "c"):
        day.started(job_id)
    assert [k for k, _, _ in day.reg.listing(keys.active_prefix("a"))] == [
        "active/a/RUNNING.1.nodes-1.stall-1800.cap-86400"]
    day.at("12:05")
    for job_id in ("a", "b", "c"):
        day.beat(job_id)
    done, listed, got = check(day)
    assert done == []
    assert listed == ["active/", "admission/", "heartbeats/"]  # no limits/; preempted-jobs/ only when needed
    assert not [key for key in got if key.endswith("/job.json")]

    day.preempted("c")  # its VM is gone: the check reads c, and leaves a preempted attempt to rerun
    done, listed, got = check(day)
    assert done == [] and "preempted-jobs/" in listed and "jobs/c/job.json" in got


def _as_written_before(day: Day, job_id: str, tail: str) -> None:
    """Rewrite a RUNNING job as a version before this one left it: job.json without its limits, a plain RUNNING
    marker, its limits and its idle flag under limits/."""
    record = day.job(job_id)
    day.store.put(day.reg.key(keys.job_record(job_id)),
                  record.model_copy(update={"limits": None}).model_dump_json(exclude_none=True).encode())
    day.reg.delete(record.marker)
    day.reg.put(keys.active_marker(job_id, State.RUNNING, record.attempt), b"")
    day.reg.put(f"limits/{job_id}/{record.attempt}/{tail}", b"")
    day.reg.put(f"limits/{job_id}/{record.attempt}/idle-flagged", b"")


def test_a_job_started_before_the_limits_rode_in_its_marker_is_moved_on_once(day: Day) -> None:
    day.started("old", max_runtime="2h")
    _as_written_before(day, "old", "nodes-1.stall-1800.cap-5400")  # the cap its old key says, not the spec's 2h
    day.at("12:05")
    day.beat("old")
    done, listed, got = check(day)
    assert rules(done) == [(Rule.LIMITS, "applied")]
    assert "limits/" in listed and "jobs/old/job.json" in got  # its old keys, and its record once
    assert day.job("old").limits == "nodes-1.stall-1800.cap-5400"
    assert [k for k, _, _ in day.reg.listing(keys.ACTIVE)] == [
        "active/old.1.idle-flagged", "active/old/RUNNING.1.nodes-1.stall-1800.cap-5400"]
    assert list(day.reg.listing(keys.LIMITS)) == []

    day.at("12:06")
    day.beat("old")
    day.reg.put_json(keys.idle_mark("old", 1, 0), {"time": day.clock().isoformat()})  # its GPUs idle: flagged before
    done, listed, got = check(day)
    assert done == [] and "limits/" not in listed and not [key for key in got if key.endswith("/job.json")]

    day.at("13:30")  # its old key's cap, 1h30m from the launch at 12:00, with the stop grace before it
    assert [(o.action.rule, o.result) for o in day.uptime_cap()] == [(Rule.TIMED_OUT, "applied")]


def test_a_debug_hold_written_under_limits_is_still_kept_and_ended(day: Day) -> None:
    day.started("held", debug_hold="30m", max_runtime="2h")
    day.at("12:10")
    day.exits("held", 0, code=3)
    assert rules(day.sweeper(jobs=["held"])) == [(Rule.FINISHED, "applied")]
    (new,) = [k for k, _, _ in day.reg.listing(keys.ACTIVE) if keys.parse_held(k)]
    day.reg.delete(new)
    until = MORNING + timedelta(minutes=40)
    day.reg.put(keys.held_mark("held", 1, until, old=True), b"")  # as a version before this one wrote it

    for hhmm in ("12:21", "12:39"):  # past the orphan grace: its held VM is no orphan
        day.at(hhmm)
        done, listed, _ = check(day)
        assert {o.action.rule for o in done} <= {Rule.CLEANUP} and "limits/" in listed, hhmm
        assert day.uptime_cap() == [] and day.vms("held") == {1: ["running"]}, hhmm
    day.at("12:40")
    done, _, _ = check(day)
    assert rules(done) == [(Rule.HOLD_OVER, "applied")] and list(day.reg.listing(keys.LIMITS)) == []
    day.at("12:45")
    done, listed, _ = check(day)
    assert done == [] and "limits/" not in listed and day.vms("held") == {1: ["terminated"]}
