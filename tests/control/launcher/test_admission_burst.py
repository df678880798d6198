"""Quotas that hold under any concurrency (issue 40, G2 of the second review): 40 drops land at once, as a burst of
launcher invocations would take them, and their threads meet at a barrier right before each reads what the quota
holds (on main: the owner's VM listing; now: the admission record's compare-and-swap). At no launch request may
more VMs be live than the quota allows; then the jobs run and end a few at a time, as the sweeper sees them, and
the waiting ones are admitted as slots free, until all 40 have run, each launched once. The day's memory cloud
(tests/control/reconcile/day.py) under real threads; the crash cases kill launcher and sweeper runs between their
writes and leave the recovery to the scheduled passes (resume, reclaim).

On main the first burst launched all 40 VMs of an owner whose quota is 4."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

from jobplane.clouds.base import TAG_OWNER, LaunchRequest
from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.admission import AdmissionRecord
from jobplane.model.states import State
from jobplane.store import admission as records
from tests.control.reconcile.day import Day

pytestmark = pytest.mark.timeout(300)

SPEC = b"run: python3 train.py\ninstance_type: t3.micro\n"


class Died(BaseException):
    """The function's runtime was killed here (a timeout, an OOM): nothing after it ran."""


class Watch:
    """What the cloud holds at each launch request: the most live VMs seen, per owner and in all."""

    def __init__(self, day: Day) -> None:
        self.day, self.lock = day, threading.Lock()
        self.most: Counter[str] = Counter()
        self.most_in_all = 0

    def launched(self, request: LaunchRequest) -> None:
        live = self.day.compute.instances(managed=True, live=True)
        owners = Counter(dict(i.tags)[TAG_OWNER] for i in live)
        with self.lock:
            for owner, count in owners.items():
                self.most[owner] = max(self.most[owner], count)
            self.most_in_all = max(self.most_in_all, len(live))


@pytest.fixture
def watch(day: Day, monkeypatch: pytest.MonkeyPatch) -> Watch:
    seen = Watch(day)
    real = day.compute.launch

    def launch(request: LaunchRequest) -> Any:
        made = real(request)
        seen.launched(request)
        return made

    monkeypatch.setattr(day.compute, "launch", launch)
    return seen


def drops(day: Day, owners: dict[str, int]) -> list[str]:
    """Each owner's drops in queue/, written before any launcher runs; their keys."""
    out = []
    for owner, count in owners.items():
        for n in range(count):
            key = keys.queue_entry(f"{owner}-{n:02d}", owner, "yaml")
            day.store.put(day.reg.key(key), SPEC)
            out.append(key)
    return out


def burst(day: Day, monkeypatch: pytest.MonkeyPatch, queued: list[str]) -> None:
    """One launcher run per drop, all at once: each thread waits at the barrier after its claim, right before
    the quota is read, so all of them read it together. A run killed by an injected crash just ends."""
    barrier = threading.Barrier(len(queued), timeout=30)
    real = launcher._launch

    def meeting(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return real(*args, **kwargs)

    def run(key: str) -> None:
        with contextlib.suppress(Died):
            launcher.handle_drop(day.context(), key, now=day.clock())

    with monkeypatch.context() as m:
        m.setattr(launcher, "_launch", meeting)
        with ThreadPoolExecutor(len(queued)) as pool:
            list(pool.map(run, queued))


def surviving(day: Day, fn: Callable[[], Any]) -> None:
    """A scheduled run; one killed is followed by the next a few minutes later, as the schedule has it."""
    for _ in range(10):
        try:
            fn()
            return
        except Died:
            day.clock.advance(5 * 60)
    raise AssertionError("killed ten times in a row")


def drain(day: Day, job_ids: list[str], rounds: int = 40) -> None:
    """The jobs run and end as the sweeper sees them: each round, launched jobs beat a minute on, every running one
    exits 0, and half an hour later (past any backoff) the backstop retries the waits and the leftover drops."""
    for _ in range(rounds):
        records = [day.job(j) for j in job_ids if day.reg.exists(j)]
        if len(records) == len(job_ids) and all(r.state == State.SUCCEEDED for r in records):
            return
        day.clock.advance(60)
        for record in records:
            if record.state == State.LAUNCHING and record.instances:
                day.beat(record.id)
        surviving(day, day.sweeper)
        exited = [r.id for r in (day.job(r.id) for r in records) if r.state == State.RUNNING]
        for job_id in exited:
            day.exits(job_id, 0, 0)
        surviving(day, partial(day.sweeper, jobs=exited))  # as the exit reports' events run it
        day.clock.advance(31 * 60)
        surviving(day, day.backstop)
    raise AssertionError({j: day.job(j).state for j in job_ids if day.reg.exists(j)})


def ran_once_each(day: Day, job_ids: list[str]) -> None:
    assert sorted(Counter(r.job_id for r in day.compute.launches).items()) == [(j, 1) for j in sorted(job_ids)]
    assert {(day.job(j).state, day.job(j).attempt) for j in job_ids} == {(State.SUCCEEDED, 1)}
    assert day.compute.instances(managed=True, live=True) == []
    held = [AdmissionRecord.parse(day.reg.get_bytes(k)) for k, _, _ in day.reg.listing(keys.ADMISSION)]
    assert held and {(r.reservations, r.waiting) for r in held} == {((), ())}, "every reservation given back"


def test_forty_drops_at_once_never_put_the_owner_over_its_quota_of_four(day: Day, watch: Watch,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    day.reg.put(keys.POLICY, b"max_active_instances_per_owner: 4\n")
    queued = drops(day, {"team-a": 40})
    burst(day, monkeypatch, queued)
    assert len(day.compute.launches) == 4 and watch.most["team-a"] == 4
    waiting = [day.job(j) for j in (keys.parse_drop(k).job_id for k in queued)]  # type: ignore[union-attr]
    assert Counter(r.state for r in waiting) == {State.LAUNCHING: 4, State.WAITING_CAPACITY: 36}
    full = "owner 'team-a' has 4 active instances; 1 more would exceed the quota of 4 (max_active_instances_per_owner)"
    assert {r.reason == full or r.reason.endswith("next); 4 of 4 nodes in use (max_active_instances_per_owner)")
            for r in waiting if r.state == State.WAITING_CAPACITY} == {True}  # full, or behind an earlier waiter
    job_ids = [r.id for r in waiting]
    drain(day, job_ids)
    assert watch.most["team-a"] == 4
    ran_once_each(day, job_ids)


CAPPED = b"max_active_instances_per_owner: 4\nmax_active_instances: 6\n"


def test_two_owners_sharing_a_deployment_cap_never_pass_it(day: Day, watch: Watch,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    day.reg.put(keys.POLICY, CAPPED)
    queued = drops(day, {"team-a": 20, "team-b": 20})
    burst(day, monkeypatch, queued)
    assert watch.most_in_all <= 6 and max(watch.most.values()) <= 4
    # A run holds its place in its owner's quota while it waits for the deployment's turn, and another job of the
    # owner, finding the quota full then, waits in the owner's line; a run the cap then refuses gives its place back,
    # and the next in-order admission (the next scheduled pass) admits from the line. Either way the cap is full
    # after that pass, and never passed.
    day.clock.advance(60)
    day.backstop()
    assert len(day.compute.launches) == 6 and watch.most_in_all == 6 and max(watch.most.values()) <= 4
    capped = AdmissionRecord.parse(day.reg.get_bytes(keys.ADMISSION_DEPLOYMENT))
    lines = {o: AdmissionRecord.parse(day.reg.get_bytes(keys.admission_owner(o))) for o in ("team-a", "team-b")}
    assert len(capped.reservations) == 6
    assert capped.waiting and all(lines[w.owner].waiter(w.job_id).capped for w in capped.waiting), \
        "the deployment's order holds only jobs their owners' lines cleared, which wait there too"
    job_ids = [keys.parse_drop(k).job_id for k in queued]  # type: ignore[union-attr]
    drain(day, job_ids)
    # fair share splits the cap 3 and 3 while both lines wait; whether one owner reaches its own quota of 4 as the
    # other's line empties depends on which slots free first, so only the bounds are the claim
    assert watch.most_in_all == 6 and max(watch.most.values()) <= 4
    ran_once_each(day, job_ids)


def test_an_earlier_job_arriving_while_a_later_one_is_at_the_deployments_cap_takes_the_last_slot(
        day: Day, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving a burst may meet, forced: team-b's line has admitted b-01, which is at the deployment's cap
    (one slot left) when b-00 arrives. b-00 passes its owner's line too (b-01 holds a place there, it does not wait in
    it) and takes the last slot; b-01 then finds the cap full and waits in the deployment's order, its place in
    team-b's line given back. No slot idles, and the cap holds."""
    day.reg.put(keys.POLICY, CAPPED)
    dropped = drops(day, {"team-a": 4, "team-c": 1, "team-b": 2})
    queued = {keys.parse_drop(k).job_id: k for k in dropped}  # type: ignore[union-attr]
    for job_id in ("team-a-00", "team-a-01", "team-a-02", "team-a-03", "team-c-00"):
        launcher.handle_drop(day.context(), queued[job_id], now=day.clock())
    real, arrived = records.change, []

    def change(objects: Any, key: str, fn: Any) -> Any:
        if key == keys.ADMISSION_DEPLOYMENT and not arrived:  # b-01, between its owner's write and this
            arrived.append("team-b-00")
            assert launcher.handle_drop(day.context(), queued["team-b-00"], now=day.clock()).result == \
                launcher.Result.LAUNCHED
        return real(objects, key, fn)

    monkeypatch.setattr(records, "change", change)
    assert launcher.handle_drop(day.context(), queued["team-b-01"], now=day.clock()).result == launcher.Result.WAITING
    monkeypatch.setattr(records, "change", real)
    assert arrived == ["team-b-00"] and [r.job_id for r in day.compute.launches[5:]] == ["team-b-00"]
    assert (day.job("team-b-00").state, day.job("team-b-01").state) == (State.LAUNCHING, State.WAITING_CAPACITY)
    deployment = AdmissionRecord.parse(day.reg.get_bytes(keys.ADMISSION_DEPLOYMENT))
    assert deployment.used() == 6 and [w.job_id for w in deployment.waiting] == ["team-b-01"]
    line = AdmissionRecord.parse(day.reg.get_bytes(keys.admission_owner("team-b")))
    assert [r.job_id for r in line.reservations] == ["team-b-00"] and [w.job_id for w in line.waiting] == ["team-b-01"]


class Crashes:
    """Kill every third call of one function (after it did its work, or before, as `after` says), 8 times at most."""

    def __init__(self, after: bool) -> None:
        self.after, self.calls, self.killed, self.lock = after, 0, 0, threading.Lock()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def dying(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls += 1
                die = self.calls % 3 == 0 and self.killed < 8
                self.killed += die
            if die and not self.after:
                raise Died
            out = fn(*args, **kwargs)
            if die:
                raise Died
            return out
        return dying


@pytest.fixture(params=["claimed", "admitted-to-the-deployment", "admitted", "launched", "ended"])
def crashes(request: pytest.FixtureRequest, day: Day, monkeypatch: pytest.MonkeyPatch) -> Iterator[Crashes]:
    """Where runs die: after the claim, before the admission; between the deployment's and the owner's admission
    writes; after the admission, before RunInstances; after RunInstances, before the VMs are recorded; after the
    write that ends (or parks) an attempt, before its reservation is given back."""
    from jobplane.control import admission
    from jobplane.store import admission as records

    where: str = request.param
    crash = Crashes(after=where not in ("claimed", "ended"))
    if where in ("claimed", "admitted"):
        monkeypatch.setattr(admission, "admit", crash.wrap(admission.admit))
    elif where == "admitted-to-the-deployment":
        real, dying = records.change, crash.wrap(records.change)

        def change(objects: Any, key: str, decide: Any) -> Any:
            return (dying if key == keys.ADMISSION_DEPLOYMENT else real)(objects, key, decide)
        monkeypatch.setattr(records, "change", change)
    elif where == "launched":
        monkeypatch.setattr(day.compute, "launch", crash.wrap(day.compute.launch))
    else:
        real_release, dying_release = records.release, crash.wrap(records.release)

        def release(objects: Any, owner: str, job_id: str, **kwargs: Any) -> bool:  # die only where one is held
            held = records.read(objects, keys.admission_owner(owner))[0].of(job_id) is not None
            return (dying_release if held else real_release)(objects, owner, job_id, **kwargs)
        monkeypatch.setattr(records, "release", release)
    yield crash
    assert crash.killed == 8, "the runs were killed as planned"
    if where == "ended":  # nobody gave those back: the sweeper's pass did, past the grace
        assert day.metrics.totals["AdmissionsReclaimed"] == 16  # each in its owner's record and the deployment's


def test_runs_killed_between_any_two_writes_never_pass_a_quota_and_lose_no_job(
        day: Day, watch: Watch, crashes: Crashes, monkeypatch: pytest.MonkeyPatch) -> None:
    day.reg.put(keys.POLICY, CAPPED)
    queued = drops(day, {"team-a": 20, "team-b": 20})
    burst(day, monkeypatch, queued)
    job_ids = [keys.parse_drop(k).job_id for k in queued]  # type: ignore[union-attr]
    drain(day, job_ids)
    assert watch.most_in_all <= 6 and max(watch.most.values()) <= 4
    ran_once_each(day, job_ids)
