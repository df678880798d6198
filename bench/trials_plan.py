"""Time of one sweep decision (jobplane.decide.trials.plan), which a sweeper run makes for every live sweep.

A sweep over lr (loguniform), width (int), opt (choice) and depth (uniform with steps) with N trials finished,
each with a curve of 100 points of a known loss, asks for k proposals (k = max_parallel with none live):
  random     the parameters drawn from (seed, number)
  bayesian   optuna's TPE, its study rebuilt from the N trials (the import is timed apart, once)
  median     the median rule judging k live trials against the N finished ones (no proposal)
Each is the best of --repeat runs (one thread, time.perf_counter).

    .venv/bin/python bench/trials_plan.py
    .venv/bin/python bench/trials_plan.py --repeat 1

Writes bench/results/trials_plan.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

from jobplane.decide.trials import TrialView, plan, random_point, trial_id
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.model.sweepspec import SweepSpec

SPEC = """run: python3 train.py
instance_type: g5.xlarge
metrics: [{name: "val:loss", regex: "val_loss (\\\\S+)"}]
sweep:
  parameters:
    lr: {loguniform: [1.0e-5, 1.0]}
    width: {int: [1, 64]}
    opt: {choice: [adam, sgd, rmsprop]}
    depth: {uniform: [1, 5], steps: 5}
  strategy: STRATEGY
  max_trials: 1000
  max_parallel: 100
  objective: {metric: "val:loss", goal: minimize}
  early_stop: {rule: median, after_step: 10}
"""


def sweep(strategy: str) -> SweepSpec:
    spec = parse_spec(SPEC.replace("STRATEGY", strategy), job_id="bench").sweep
    assert spec is not None
    return spec


def finished(s: SweepSpec, n: int) -> list[TrialView]:
    trials = []
    for number in range(1, n + 1):
        p = random_point(s, number)
        assert isinstance(p["lr"], float) and isinstance(p["width"], int)
        loss = (math.log10(p["lr"]) + 2.5) ** 2 + ((p["width"] - 40) / 16) ** 2
        curve = tuple((step, loss + 1 / step) for step in range(1, 101))
        trials.append(TrialView(number, trial_id("bench", number), p, State.SUCCEEDED, curve, curve[-1][1]))
    return trials


def best_of(repeat: int, run: Any) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--finished", type=int, nargs="+", default=[100, 500, 900], help="trials finished")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trials_plan.json")
    args = parser.parse_args()
    start = time.perf_counter()
    import optuna  # noqa: F401  # what the first bayesian plan of a fresh sweeper pays once

    rows: list[dict[str, Any]] = [{"case": "import optuna", "seconds": round(time.perf_counter() - start, 3)}]
    for n in args.finished:
        for strategy in ("random", "bayesian"):
            s = sweep(strategy)
            trials = finished(s, n)
            for k in (1, 10, 100):
                one = s.model_copy(update={"max_parallel": k})
                seconds = best_of(args.repeat, lambda: plan(one, trials))  # noqa: B023  # called at once
                rows.append({"case": strategy, "finished": n, "proposals": k, "seconds": round(seconds, 4)})
        s = sweep("random")
        trials = finished(s, n)
        live = [TrialView(n + i, trial_id("bench", n + i), {}, State.RUNNING, t.curve[:50], None)
                for i, t in enumerate(trials[:100], start=1)]
        stopped = len(plan(s, [*trials, *live]).stop)
        seconds = best_of(args.repeat, lambda: plan(s, [*trials, *live]))  # noqa: B023
        rows.append({"case": "median", "finished": n, "judged": len(live), "stopped": stopped,
                     "seconds": round(seconds, 4)})
    result = {"machine": f"{platform.machine()}, {platform.python_version()}", "repeat": args.repeat, "rows": rows}
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
