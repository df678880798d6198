"""Two sweep reconcile runs at once, many times, over a store that enforces compare-and-swap: the record's CAS is
what keeps them from proposing one trial twice or more than max_trials (the loser re-reads and decides again).

The store widens the race on purpose: a read of sweep.json yields the thread, so both runs usually decide on the
same version, and the test checks that they did collide (writes refused) and that nothing came of it: every trial
number once, each trial's drop written once, never more than max_trials, never more than max_parallel live."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from datetime import datetime

import pytest

from jobplane.clouds.base import Blob, PreconditionFailed
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore
from jobplane.control import launcher
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import drops, keys
from jobplane.model.states import TERMINAL, State
from jobplane.store.registry import Registry
from jobplane.sweeps import run, store
from tests.control.reconcile.day import MORNING
from tests.helpers import publish_agent_manifest, race
from tests.sweeps.helpers import sweep_spec

pytestmark = pytest.mark.timeout(120)
MAX_TRIALS, MAX_PARALLEL, ROUNDS = 12, 3, 30


class RacyStore(MemoryStore):
    """A MemoryStore whose reads of a sweep record let the other thread in, and which counts the drops written
    per key and the record writes it refused."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.drops: Counter[str] = Counter()
        self.refused = 0
        self.gate: threading.Barrier | None = None  # both runs' first read of the record meet here
        self.met: set[int] = set()

    def get(self, key: str) -> Blob:
        blob = super().get(key)
        if key.endswith("/sweep.json"):
            if self.gate is not None and threading.get_ident() not in self.met:
                self.met.add(threading.get_ident())
                with contextlib.suppress(threading.BrokenBarrierError):  # the other run read no record
                    self.gate.wait(timeout=1)
            time.sleep(0.001)
        return blob

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        version = super().put_if_absent(key, data, content_type, tags)
        if key.startswith(keys.QUEUE):
            self.drops[key] += 1
        return version

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        try:
            return super().put_if_match(key, data, version, content_type)
        except PreconditionFailed:
            self.refused += 1
            raise


def two_at_once(ctx: Context, racy: RacyStore, now: datetime) -> list[run.Outcome]:
    """Two sweep reconcile runs released together, their first reads of the record made at once (so they decide
    on one version, however loaded the machine); both must finish (a refused write never escapes a run)."""
    racy.gate, racy.met = threading.Barrier(2), set()
    outcomes: list[run.Outcome] = []
    try:
        assert sorted(race(2, lambda _: outcomes.extend(run.reconcile(ctx, now=now).outcomes),
                           PreconditionFailed)) == [0, 1]
    finally:
        racy.gate = None  # the test's own reads of the record after the race wait for no one
    return outcomes


def end_some(reg: Registry, rng: random.Random) -> None:
    """The launcher takes the queued trials' drops (recording each job), and some live trials end."""
    for key, _, _ in list(reg.listing(keys.QUEUE)):
        drop = keys.parse_drop(key)
        assert drop is not None
        reg.create_job(drop.job_id, drops.read_spec(drop, reg.get_bytes(key)))
        reg.delete(key)
    for job_id in sorted(reg.active()):
        if rng.random() < 0.6:
            reg.transition(job_id, State.CANCELLED, reason="ended", expect={State.QUEUED})


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_two_runs_at_once_never_propose_a_trial_twice_nor_too_many(seed: int) -> None:
    # every try must keep the sweep whole; the runs must have collided in one try at least (the store let them read
    # the same version): on a loaded machine a run can miss the other at the barrier, or no round had two writers,
    # and then the check could not tell, so it tries again with the rounds of another seed rather than failing
    refused = []
    for attempt in range(3):
        refused.append(one_sweep(seed + attempt * ROUNDS))
        if refused[-1] > 0:
            return
    raise AssertionError(f"the two runs never collided in 3 tries (writes refused: {refused})")


def one_sweep(seed: int) -> int:
    """A sweep taken to its end by pairs of runs at once, checked throughout; returns the writes refused."""
    clock = Clock(MORNING)
    racy = RacyStore(clock)
    reg = Registry(racy)
    publish_agent_manifest(reg, "aws")
    ctx = Context(reg, MemoryCompute(clock), reg.policy(), CountingMetrics())
    rng = random.Random(seed)
    text = "run: python3 train.py\ninstance_type: t3.micro\n" + sweep_spec(max_trials=MAX_TRIALS,
                                                                          max_parallel=MAX_PARALLEL)
    reg.put(keys.queue_entry("s"), text.encode())
    assert launcher.handle_drop(ctx, keys.queue_entry("s"), now=clock()).result == "sweep"
    proposed: list[str] = []
    for _ in range(4 * MAX_TRIALS):
        end_some(reg, rng)
        outcomes = two_at_once(ctx, racy, clock())
        proposed += [o.trial for o in outcomes if o.result == run.Result.PROPOSED and o.trial]
        assert all(o.result == run.Result.PROPOSED or o.result == run.Result.ENDED for o in outcomes), outcomes
        record = store.get(reg, "s")[0]
        numbers = [t.number for t in record.trials]
        assert numbers == list(range(1, len(numbers) + 1))
        assert len(numbers) <= MAX_TRIALS
        live = [t for t in record.trials if not (reg.exists(t.job_id) and reg.job(t.job_id).state in TERMINAL)]
        assert len(live) <= MAX_PARALLEL, live
        if not record.live:
            break
        clock.advance(60)
    record = store.get(reg, "s")[0]
    assert record.state == "FAILED"  # every trial ended CANCELLED: none reported the objective
    assert len(record.trials) == MAX_TRIALS
    assert sorted(proposed) == sorted(set(proposed))  # each trial proposed by one run only
    assert set(racy.drops) == {keys.queue_entry(t.job_id) for t in record.trials}
    assert set(racy.drops.values()) == {1}  # each drop written once
    return racy.refused
