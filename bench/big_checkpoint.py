"""Big checkpoints saved in place more often than they can be copied (issue 37's GPU run, without a GPU).

A training loop (tests/agent/big_writer.py) rewrites one checkpoint of --size-mib in place, never renamed, each
save spread over --save-s (its writes plus pauses between them, as serializing and copying tensors off a GPU
are) and followed by --pause-s of training (a third more or less, at random): a save takes longer than the pause
after it. The real Keeper syncs it every --interval seconds into an in-memory bucket whose uploads run at
--upload-mbps (slower than the saves, as a few GB to a bucket are), with the job frozen for at most --freeze
seconds for each copy. With --load N, N busy loops run meanwhile (nice 0, as the issue's two).

  preemptions  --attempts attempts, each preempted at a random moment (2-3 sync intervals in) the way the agent
               does it (freeze, record what is open, SIGTERM, grace, SIGKILL, final sync), with and without a
               SIGTERM handler in turn; the next attempt restores. Per attempt: the saves finished, their time and
               pause, the step restored next vs the last one finished (steps and seconds, and the bound: one save
               cycle plus one sync interval), whether whole, each freeze for a copy.
  cost         the same loop for --cost-s seconds with no keeper, with the keeper, and with --freeze 0 (copies
               only between two saves, never frozen), --rounds times interleaved: the median save cycle of each,
               so what the keeper costs the training, and the time frozen per freeze and its share of the runs.

    .venv/bin/python bench/big_checkpoint.py                        # 800 MiB, 3 s syncs, 2 busy loops
    .venv/bin/python bench/big_checkpoint.py --size-mib 300 --load 0

Writes bench/results/big_checkpoint.json (and prints it).
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import report  # noqa: E402

from jobplane.store.registry import Registry  # noqa: E402
from tests.agent.big_writer import Attempt, Job, Slow  # noqa: E402


def job(args: argparse.Namespace, tmp: Path, freeze: float) -> Job:
    return Job(Registry(Slow(args.upload_mbps)), tmp, size=args.size_mib << 20, interval=args.interval,
               save_s=args.save_s, pause_s=args.pause_s, freeze=freeze)


def cycles(attempt: Attempt) -> dict[str, float]:
    saves = attempt.saves
    ends = [s.ended for s in saves]
    return {"saves": len(saves),
            "save_s": round(statistics.mean(s.ended - s.began for s in saves), 3) if saves else 0.0,
            "pause_s": round(statistics.mean(b.began - a.ended for a, b in itertools.pairwise(saves)), 3)
            if len(saves) > 1 else 0.0,
            "cycle_s": round((ends[-1] - ends[0]) / (len(ends) - 1), 3) if len(ends) > 1 else 0.0}


def preemptions(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    run = job(args, tmp, args.freeze)
    for n in range(args.attempts):
        run.run(ran=rng.uniform(2, 3) * args.interval, handler=n % 2 == 1, grace=rng.choice([0.5, 5.0]))
    run.restore()
    rows = []
    for before, after in zip(run.attempts, run.attempts[1:], strict=False):
        lag, bound = run.lag(after), run.cycle(before) + run.interval
        # a whole restored step newer than the log's last was saved: the kill cut its log line
        last = max(before.saves[-1].step if before.saves else before.restored or 0, after.restored or 0)
        rows.append({"attempt": before.number, "handler": before.number % 2 == 0, "ran_s": round(before.ran, 2),
                     **cycles(before), "last_saved": last, "restored_next": after.restored, "whole": after.whole,
                     "steps_lost": last - (after.restored or 0), "lag_s": round(lag or 0.0, 2),
                     "bound_s": round(bound, 2), "frozen_s": [round(f, 3) for f in before.frozen]})
        print(rows[-1], flush=True)
    return rows


def cost(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Each way --rounds times, interleaved (a busy machine's drift hits all alike); the medians."""
    ways = {"no keeper": (args.freeze, False), "keeper": (args.freeze, True), "keeper, never frozen": (0.0, True)}
    runs: dict[str, list[Attempt]] = {name: [] for name in ways}
    for n in range(args.rounds):
        for name, (freeze, keep) in ways.items():
            run = job(args, tmp / f"{name.replace(' ', '-').replace(',', '')}-{n}", freeze)
            runs[name].append(run.run(ran=args.cost_s, handler=True, grace=5.0, keep=keep))
            print(name, n, cycles(runs[name][-1]), flush=True)
    out: dict[str, Any] = {}
    for name, attempts in runs.items():
        frozen = [f for attempt in attempts for f in attempt.frozen]
        out[name] = {"cycle_s": round(statistics.median(cycles(a)["cycle_s"] for a in attempts), 3),
                     "cycles_s": [cycles(a)["cycle_s"] for a in attempts],
                     "freezes_per_run": round(len(frozen) / len(attempts), 1),
                     "frozen_per_freeze_s": round(statistics.mean(frozen), 3) if frozen else 0.0,
                     "frozen_max_s": round(max(frozen), 3) if frozen else 0.0,
                     "frozen_share": round(sum(frozen) / sum(a.ran for a in attempts), 4)}
    base = out["no keeper"]["cycle_s"]
    for name in ("keeper", "keeper, never frozen"):
        out[name]["cycle_vs_no_keeper"] = round(out[name]["cycle_s"] / base - 1, 4) if base else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--size-mib", type=int, default=800)
    p.add_argument("--save-s", type=float, default=0.5, help="pauses within one save (plus its writes)")
    p.add_argument("--pause-s", type=float, default=0.3, help="training between two saves (a third more or less)")
    p.add_argument("--interval", type=float, default=3.0, help="the agent's checkpoint sync interval")
    p.add_argument("--upload-mbps", type=float, default=200.0)
    p.add_argument("--freeze", type=float, default=1.0)
    p.add_argument("--attempts", type=int, default=6)
    p.add_argument("--cost-s", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=3, help="of the cost runs")
    p.add_argument("--load", type=int, default=2, help="busy loops meanwhile")
    p.add_argument("--seed", type=int, default=37)
    args = p.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        with tempfile.TemporaryDirectory(prefix="big-checkpoint-") as tmp:
            result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                      "args": vars(args), "preemptions": preemptions(args, Path(tmp) / "preemptions"),
                      "cost": cost(args, Path(tmp) / "cost")}
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return report.save("big_checkpoint", result)


if __name__ == "__main__":
    raise SystemExit(main())
