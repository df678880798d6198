"""Where a benchmark's result goes: bench/results/<name>.json (gitignored, but for the files docs/benchmarks.md
is rendered from), and printed. JOBPLANE_BENCH_RESULTS names another folder (the bench smoke test's)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("JOBPLANE_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def save(name: str, result: dict[str, Any]) -> int:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0
