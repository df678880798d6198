"""Store calls of one sweep reconcile run (jobplane.sweeps.run), what each sweeper run adds per live sweep.

A sweep of N trials, N - 3 ended (SUCCEEDED, recorded in the sweep's record) and 3 running, each trial with C
metric chunks (an agent ships one every 10 s: C = 360 is an hour), max_parallel 3 (nothing to propose):
  cold      the first run, no curve read yet
  steady    the next run, after each live trial shipped one more chunk
with the median rule (every trial's curve compared) and without an early-stop rule. A run with no live sweep
makes one LIST (active-sweeps/). Counted on the in-memory store (GET, PUT, LIST pages, DELETE), and timed.

    .venv/bin/python bench/sweep_reconcile.py

Writes bench/results/sweep_reconcile.json (and prints it).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # bench/report.py: where a result goes

from jobplane.clouds.memory import Clock, MemoryStore
from jobplane.decide.trials import random_point, trial_id
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, metrics
from jobplane.model.metrics import Point
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from jobplane.sweeps import run, store
from jobplane.sweeps.record import SweepRecord, Trial

START = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
SPEC = """run: python3 train.py
instance_type: g5.xlarge
sweep:
  parameters: {lr: {loguniform: [1.0e-5, 1.0]}}
  max_trials: 1000
  max_parallel: 3
  objective: {metric: loss, goal: minimize}
"""
LIVE = 3


def chunk(reg: Registry, job_id: str, seq: int, at: datetime) -> None:
    points = [Point("loss", 1 / (seq * 10 + i + 1), seq * 10 + i) for i in range(10)]
    data = reg.job(job_id).data
    reg.put(keys.metrics_chunk(data, 1, 0, seq), b"".join(metrics.encode(p, at) for p in points))


def build(n: int, chunks: int, early_stop: bool) -> tuple[Registry, MemoryStore, Clock, SweepRecord]:
    clock = Clock(START)
    memory = MemoryStore(clock)
    reg = Registry(memory)
    text = SPEC + ("  early_stop: {rule: median, after_step: 10}\n" if early_stop else "")
    spec = parse_spec(text, job_id="bench")
    sweep = spec.sweep
    assert sweep is not None
    trials = []
    for number in range(1, n + 1):
        job_id = trial_id("bench", number)
        ended = number <= n - LIVE
        trials.append(Trial(number=number, job_id=job_id, params=random_point(sweep, number), proposed_at=clock(),
                            state=State.SUCCEEDED if ended else None, objective=0.5 if ended else None))
        trial = spec.model_copy(update={"sweep": None, "labels": {"sweep": "bench", "trial": str(number)}})
        reg.create_job(job_id, trial, clock())
        reg.transition(job_id, State.LAUNCHING, now=clock(), attempt=1, instances=[f"i-{number}"])
        reg.transition(job_id, State.RUNNING, now=clock())
        if ended:
            reg.transition(job_id, State.SUCCEEDED, now=clock())
        for seq in range(chunks):
            chunk(reg, job_id, seq, clock())
    record = store.create(reg, SweepRecord.new("bench", spec, clock()).model_copy(update={"trials": trials}))
    return reg, memory, clock, record


def measured(reg: Registry, memory: MemoryStore, clock: Clock) -> dict[str, Any]:
    memory.calls.clear()
    start = time.perf_counter()
    outcomes = run.reconcile(Context(reg, None, reg.policy(), CountingMetrics()), now=clock()).outcomes
    seconds = time.perf_counter() - start
    assert all(o.result != run.Result.ERROR for o in outcomes), outcomes
    return {**{op: memory.calls.get(op, 0) for op in ("get", "put", "list", "delete")},
            "seconds": round(seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["12x36", "100x36", "100x360"],
                        help="trials x metric chunks per trial")
    rows: list[dict[str, Any]] = []
    for n, chunks in (map(int, case.split("x")) for case in parser.parse_args(argv).cases):
        for early_stop in (True, False):
            reg, memory, clock, _ = build(n, chunks, early_stop)
            cold = measured(reg, memory, clock)
            clock.advance(10)
            for number in range(n - LIVE + 1, n + 1):
                chunk(reg, trial_id("bench", number), chunks, clock())
            steady = measured(reg, memory, clock)
            clock.advance(timedelta(minutes=1).total_seconds())
            rows.append({"trials": n, "live": LIVE, "chunks_per_trial": chunks,
                         "early_stop": "median" if early_stop else "none", "cold": cold, "steady": steady})
    idle = MemoryStore()
    ctx = Context(Registry(idle), None, Registry(idle).policy(), CountingMetrics())
    idle.calls.clear()  # the policy's GET is the invocation's, not the sweeps'
    run.reconcile(ctx, now=START)
    return report.save("sweep_reconcile", {"machine": f"{platform.machine()}, {platform.python_version()}",
                                           "no_live_sweep": dict(idle.calls), "rows": rows})


if __name__ == "__main__":
    raise SystemExit(main())
