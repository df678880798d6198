"""An owner's spend is charged from what ran (issue 59), through days on the manual clock: the type and market each
attempt's VMs launched as, at that type's price, whatever path ends the attempt. On main a type the price table
lacked cost nothing, a spec's first type was charged while its job ran on another, and a reservation the check
reclaimed (its release lost to a 5xx or a crash) was dropped with no charge."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from jobplane.clouds.base import StoreError
from jobplane.clouds.memory import Clock, MemoryStore
from jobplane.model import keys, prices
from jobplane.model.states import TERMINAL, State
from jobplane.ops import budgets
from tests.control.reconcile.day import Day, new_day

DOLLARS_AN_HOUR = 60.0  # t3.micro here: a dollar a minute
POLICY = f"prices: {{t3.micro: {DOLLARS_AN_HOUR}}}\nbudgets:\n  monthly_usd: {{team-a: {{budget}}}}\n"


def policy(day: Day, budget: float, more: str = "") -> None:
    day.reg.put(keys.POLICY, (POLICY.replace("{budget}", f"{budget:g}") + more).encode())


def spent(day: Day) -> float:
    (standing,) = budgets.standings(day.reg, day.clock())
    return standing.spent


def check(day: Day, hhmm: str) -> None:
    """At hhmm every job with VMs beats and the scheduled check runs."""
    day.at(hhmm)
    for live in {inst.job_id for inst in day.compute.list_managed()}:
        day.beat(str(live))
    day.sweeper()


def finish(day: Day, job_id: str, hhmm: str) -> None:
    """At hhmm the job's rank exits 0 and its exit report's check runs."""
    check(day, hhmm)
    day.exits(job_id, 0, 0)
    day.sweeper(jobs=[job_id])


def test_ten_hours_of_a_gpu_type_the_accelerator_table_knows_are_charged(day: Day) -> None:
    """p4de.24xlarge (8 x A100) was in the accelerator table and not in the price table: ten hours of it left a $10
    budget at $0.00, and the owner's next job launched."""
    policy(day, 10)
    assert day.drop("team-a", "big", "p4de.24xlarge") == "launched"
    finish(day, "big", "22:00")
    assert day.job("big").state == State.SUCCEEDED
    assert spent(day) > 10 * 20, "8 x A100 cost more than $20 an hour anywhere"
    assert spent(day) == pytest.approx(10 * prices.AWS["p4de.24xlarge"], rel=1e-3)
    assert day.drop("team-a", "next") == "failed", "the owner is past its budget"
    assert day.job("next").cause == "over-budget"


def test_a_type_with_no_price_is_refused_under_a_budget_naming_prices(day: Day) -> None:
    policy(day, 10)
    assert "x9.48xlarge" not in prices.AWS
    assert day.drop("team-a", "unpriced", "x9.48xlarge") == "invalid"
    assert "prices" in (day.job("unpriced").reason or "")
    assert day.drop("team-b", "free", "x9.48xlarge") == "launched", "an owner with no budget needs no price"
    day.reg.put(keys.POLICY, POLICY.replace("{budget}", "10").replace("{t3", "{x9.48xlarge: 3.5, t3").encode())
    assert day.drop("team-a", "priced", "x9.48xlarge") == "launched", "the policy's prices give it one"


def test_an_attempt_on_a_later_type_is_charged_that_types_price_while_it_runs_and_after(day: Day) -> None:
    """A spec of [t3.micro, p4d.24xlarge] that got p4d (no t3 capacity) for 5 h showed $0.05 of $10: the first
    type's price, which the code called the most it may cost."""
    day.reg.put(keys.POLICY, b"budgets: {monthly_usd: {team-a: 1000}}\n")
    day.compute.fail("t3.micro")
    assert day.drop("team-a", "fell", spec="instance_type: [t3.micro, p4d.24xlarge]\n") == "launched"
    assert day.job("fell").instance_type == "p4d.24xlarge"
    check(day, "17:00")
    p4d = prices.AWS["p4d.24xlarge"]
    assert spent(day) == pytest.approx(5 * p4d, rel=1e-3), "five hours of p4d while it runs"
    finish(day, "fell", "17:00")
    assert spent(day) == pytest.approx(5 * p4d, rel=1e-3), "and when it ends"


def test_an_attempt_on_the_cheaper_type_is_charged_its_own_price_while_it_runs(day: Day) -> None:
    """The admission reserves the dearest type a spec may get; the launch says which it got."""
    day.reg.put(keys.POLICY, b"budgets: {monthly_usd: {team-a: 1000}}\n")
    assert day.drop("team-a", "cheap", spec="instance_type: [t3.micro, p4d.24xlarge]\n") == "launched"
    check(day, "17:00")
    assert spent(day) == pytest.approx(5 * prices.AWS["t3.micro"], rel=1e-3)


class Flaky(MemoryStore):
    """A MemoryStore whose writes of one key fail with a 5xx the SDK gave up on, while `failing` names it."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        super().__init__(clock)
        self.failing: str | None = None

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        if key == self.failing:
            raise StoreError("503 SlowDown (retries exhausted)")
        return super().put_if_match(key, data, version, content_type)


def test_a_reservation_reclaimed_after_its_release_failed_is_charged_its_hours() -> None:
    """One failed write of the owner's record at the job's end left the reservation to the reclaim, which dropped it
    with no charge: an hour at $60/h stayed $0.00."""
    store: list[Flaky] = []

    def flaky(clock: Clock) -> MemoryStore:
        store.append(Flaky(clock))
        return store[0]

    day = new_day(flaky)
    policy(day, 1000)
    assert day.drop("team-a", "a1") == "launched"
    check(day, "12:01")
    store[0].failing = day.reg.key(keys.admission_owner("team-a"))
    finish(day, "a1", "13:00")
    store[0].failing = None
    assert day.job("a1").state == State.SUCCEEDED
    check(day, "13:05")  # the reclaim: the reservation no live job holds, older than its grace
    owner = day.reg.get_json(keys.admission_owner("team-a"))
    assert not owner.get("reservations"), "reclaimed"
    assert spent(day) == pytest.approx(DOLLARS_AN_HOUR), "its hour, charged by the reclaim"


class Crash(BaseException):
    """The function's runtime died here (a timeout, out of memory): nothing after it in the run happens."""


class Crashing(MemoryStore):
    """A MemoryStore that kills the running function at its `armed`-th write (0: never), counting writes."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        super().__init__(clock)
        self.armed = 0
        self.writes: list[str] = []

    def _writing(self, key: str) -> None:
        if self.armed:
            self.writes.append(key)
            if len(self.writes) == self.armed:
                raise Crash(key)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self._writing(key)
        return super().put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json", **kw: Any) -> str:
        self._writing(key)
        return super().put_if_absent(key, data, content_type, **kw)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        self._writing(key)
        return super().put_if_match(key, data, version, content_type)

    def delete(self, key: str) -> None:
        self._writing(key)
        super().delete(key)


def crash_day(at: int) -> tuple[Day, Crashing]:
    """a1 runs 12:00-13:00 at $60/h; the check that ends it dies at its `at`-th write (a huge `at`: it never does)."""
    made: list[Crashing] = []

    def crashing(clock: Clock) -> MemoryStore:
        made.append(Crashing(clock))
        return made[0]

    day = new_day(crashing)
    store = made[0]
    policy(day, 1000, "max_active_instances: 10\nmax_active_by_family: {t3: 10}\n")
    assert day.drop("team-a", "a1") == "launched"
    check(day, "12:01")
    check(day, "12:59")
    day.at("13:00")
    day.exits("a1", 0, 0)
    store.armed = at
    with contextlib.suppress(Crash):
        day.sweeper(jobs=["a1"])
    store.armed = 0
    return day, store


def test_a_crash_at_any_write_of_an_attempts_end_leaves_the_spend_within_a_check_of_the_truth() -> None:
    """The check that ends a job writes its record, its event, its markers, the deployment's, the family's and the
    owner's admission records: a function that dies before any one of them leaves the month's spend, once later
    checks have run, between the truth (its hour at $60) and one check period (5 minutes) more."""
    whole, store = crash_day(10_000)
    assert whole.job("a1").state == State.SUCCEEDED and spent(whole) == pytest.approx(DOLLARS_AN_HOUR)
    writes = list(store.writes)
    assert any("admission/owners/" in key for key in writes) and any(key.endswith("job.json") for key in writes)
    for at in range(1, len(writes) + 1):
        day, _ = crash_day(at)
        for hhmm in ("13:05", "13:10", "13:15"):
            check(day, hhmm)
        assert day.job("a1").state == State.SUCCEEDED, (at, writes[at - 1])
        truth, now = DOLLARS_AN_HOUR, spent(day)
        assert truth - 1e-6 <= now <= truth + DOLLARS_AN_HOUR * 5 / 60 + 1e-6, (at, writes[at - 1], now)
        check(day, "13:30")
        assert spent(day) == pytest.approx(now), (at, writes[at - 1], "settled: nothing left accruing")


def test_an_attempt_whose_vm_vanishes_is_charged_its_hours(day: Day) -> None:
    """No exit report, no release by the agent: the VM is gone (deleted outside jobplane, a host failure). The check
    that sees it lost ends the attempt, and the release charges its hours at its price."""
    policy(day, 1000)
    assert day.drop("team-a", "gone") == "launched"
    check(day, "12:30")
    day.compute.reclaim(day.job("gone").instances[0])
    for hhmm in ("12:35", "12:40", "12:45", "12:50"):
        check(day, hhmm)
    record = day.job("gone")
    assert record.state in TERMINAL, record.state
    ended = record.usage[0].instances[0].end
    assert ended is not None
    truth = DOLLARS_AN_HOUR * (ended - record.usage[0].instances[0].start).total_seconds() / 3600
    assert truth >= DOLLARS_AN_HOUR / 2 and spent(day) == pytest.approx(truth)
    check(day, "13:30")
    assert spent(day) == pytest.approx(truth), "nothing left accruing"
