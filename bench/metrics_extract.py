"""Per-line cost of reading metrics and stop rules from a job's output (what the agent adds to every line).

A synthetic log of a chatty training job (data-loader chatter, tqdm progress bars, `step N loss X lr Y`
lines, Hugging Face style dicts, the odd 20 kB tensor dump) is fed line by line through:
  baseline   what the agent did before: the `step N` regex on the raw bytes
  defaults   jobplane.model.metrics.Extractor with the default metrics (loss, accuracy, learning_rate, step)
  stop_on    the defaults plus stop_on: nan and three patterns
  maximum    40 metric definitions and 20 stop patterns, the most a spec may have
  agent      OutputLog.user with the defaults and stop_on: decode, extract, encode the points, the locks
Each is timed over the whole log (best of --repeat runs, one thread, time.perf_counter).

    .venv/bin/python bench/metrics_extract.py              # 200,000 lines
    .venv/bin/python bench/metrics_extract.py --lines 50000

Writes bench/results/metrics_extract.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobplane.agent.output import OutputLog
from jobplane.model.metrics import MAX_LINE, Extractor
from jobplane.model.specfields import MetricDefinition, StopOn

OLD_STEP = re.compile(rb"\bstep\b\s*[:=]?\s*(\d+)", re.IGNORECASE)  # the agent's only regex before metrics
PATTERNS = ["CUDA out of memory", r"Traceback \(most recent call last\)", r"NCCL (?:error|timeout)"]


def synthetic_log(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.45:
            line = (f"INFO 2026-11-22 12:00:{i % 60:02d} dataloader worker {i % 8} fetched shard {i} "
                    f"in {rng.random():.3f}s ({rng.randint(100, 900)} samples)")
        elif kind < 0.70:
            pct = i % 100
            line = (f" {pct}%|{'#' * (pct // 10):<10}| {pct * 10}/1000 [00:{pct % 60:02d}<00:15, "
                    f"{rng.random() * 40:.1f}it/s]")
        elif kind < 0.90:
            line = f"step {i} loss {rng.random() * 3:.6f} lr {1e-4 * rng.random():.3e} grad_norm {rng.random():.3f}"
        elif kind < 0.9995:
            line = f"{{'loss': {rng.random():.4f}, 'learning_rate': {rng.random() * 1e-4:.2e}, 'epoch': {i / n:.2f}}}"
        else:
            line = "tensor([" + ", ".join(f"{rng.random():.4f}" for _ in range(2500)) + "])"  # ~20 kB
        lines.append(line.encode() + b"\n")
    return lines


def timed(lines: list[bytes], feed: Callable[[bytes], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for line in lines:
            feed(line)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "metrics_extract.json")
    args = parser.parse_args()
    lines = synthetic_log(args.lines)
    many = [MetricDefinition(name=f"m{i}", regex=rf"\bm{i}[:=]\s*([0-9.eE+-]+)") for i in range(40)]
    cases: dict[str, Callable[[], Callable[[bytes], object]]] = {
        "baseline": lambda: OLD_STEP.search,
        "defaults": lambda: extracting(Extractor()),
        "stop_on": lambda: extracting(Extractor(stop_on=StopOn(nan=True, patterns=PATTERNS))),
        "maximum": lambda: extracting(Extractor(many, StopOn(nan=True, patterns=[
            *PATTERNS, *(f"never-{i}" for i in range(17))]))),
        "agent": agent,
    }
    points = 0
    counter = Extractor()
    for line in lines:
        points += len(counter.line(line.decode())[0])
    results: dict[str, Any] = {}
    for name, make in cases.items():
        seconds = timed(lines, make(), args.repeat)
        results[name] = {"seconds": round(seconds, 3), "us_per_line": round(seconds / len(lines) * 1e6, 2),
                         "lines_per_second": round(len(lines) / seconds)}
    base = results["baseline"]["us_per_line"]
    for name in cases:
        added = results[name]["us_per_line"] - base
        results[name]["added_us_per_line"] = round(added, 2)
        # one core's share spent on it by a job printing 1,000 lines a second (a very chatty one)
        results[name]["cpu_percent_at_1000_lines_per_s"] = round(results[name]["us_per_line"] / 10, 2)
    report = {"bench": "metrics_extract", "python": platform.python_version(), "machine": platform.machine(),
              "lines": len(lines), "bytes": sum(map(len, lines)), "max_line_chars": MAX_LINE,
              "default_metric_points": points, "repeat": args.repeat, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


def extracting(extractor: Extractor) -> Callable[[bytes], object]:
    return lambda line: extractor.line(line.decode(errors="replace"))


def agent() -> Callable[[bytes], object]:
    """OutputLog.user as the pump thread calls it; every 1,000 lines the shipping thread's take()s."""
    out = OutputLog(None)
    out.watch(Extractor(stop_on=StopOn(nan=True, patterns=PATTERNS)), lambda why: None)
    fed = 0

    def feed(line: bytes) -> None:
        nonlocal fed
        out.user(line)
        fed += 1
        if fed % 1000 == 0:
            out.take()
            out.take_points()
    return feed


if __name__ == "__main__":
    main()
