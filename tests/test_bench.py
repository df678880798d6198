"""Benchmarks cannot rot: every script in bench/ runs here at a tiny size, into a folder of the test's, and must
have measured something (calls counted, files moved, lines read); and docs/benchmarks.md's tables are what
bench/render.py makes of the committed JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.warm import Warm

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
Check = Callable[[dict[str, Any]], bool]


def _transfer_moved(doc: dict[str, Any]) -> bool:
    cells = {(r["cloud"], r["data"], r["direction"]): (r["files"], r["bytes"]) for r in doc["rows"]}
    return cells == {(cloud, data, direction): ((4, 4 * 1024) if data == "many" else (1, 1 << 20))
                     for cloud in ("s3", "gcs") for data in ("many", "big") for direction in ("up", "down")}


# script: (its arguments at a tiny size, the JSON it writes, what it must have measured)
SMOKE: dict[str, tuple[list[str], str, Check]] = {
    "big_checkpoint.py": (["--size-mib", "4", "--attempts", "1", "--cost-s", "1", "--rounds", "1", "--load", "0",
                           "--save-s", "0.1", "--pause-s", "0.1", "--interval", "0.5"],
                          "big_checkpoint.json",
                          lambda d: d["preemptions"][0]["saves"] > 0 and d["preemptions"][0]["whole"] is True
                          and d["cost"]["keeper"]["cycle_s"] > 0),
    # the control functions beside the baseline, each a fresh interpreter (about a CPU second) whose first scheduled
    # run, against an idle registry, loads no pydantic (only a record does); every handler's imports are
    # tests/control/launcher/test_cold_start.py's, and the script's default is every handler
    "cold_start.py": (["--rounds", "1", "--warmup", "0", "--handlers", "launcher", "rerun", "sweeper", "uptime_cap"],
                      "cold-start.json",
                      lambda d: len(d["handlers"]) == 4 and d["baseline"]["import_ms"] > 0
                      and d["floor"]["import_ms"] > 0
                      and all(h["import_ms"] > 0 and h["modules_after_first_invocation"] > 0
                              and not h["pydantic_after_first_invocation"] for h in d["handlers"].values())),
    # its cold start is gcp_check.py's import_seconds(), timed in gcp_check.py's run below (a fresh interpreter's
    # GCP imports: 2.5 CPU s a run)
    "gcp_idle.py": (["--runs", "1", "--no-cold-start"], "gcp_idle.json",
                    lambda d: d["scenarios"]["small_registry_3_jobs"]["sweeper"]["compute_calls_per_invocation"]
                    .get("aggregatedList", 0) > 0),
    "gcp_check.py": (["--n", "5", "--out", "{out}/gcp_check.json"], "gcp_check.json",
                     lambda d: d["results"][0]["check"]["gcs"]["list_pages"] > 0
                     and sorted(d["import_seconds"]) == ["compute_client", "functions_module", "storage_client"]
                     and d["import_seconds"]["functions_module"] > 0),
    "lambda_idle.py": (["--runs", "1", "--no-cold-imports"], "lambda_idle.json",
                       lambda d: d["scenarios"]["idle"]["sweeper"]["api_calls_per_invocation"]
                       .get("s3.ListObjectsV2", 0) > 0),
    "metrics_extract.py": (["--lines", "500", "--repeat", "1", "--out", "{out}/metrics_extract.json"],
                           "metrics_extract.json",
                           lambda d: d["lines"] == 500 and d["default_metric_points"] > 0
                           and d["results"]["defaults"]["us_per_line"] > 0),
    "check.py": (["--n", "5", "--out", "{out}/check.json"], "check.json",
                 lambda d: d["results"][0]["check"]["total_calls"] > 0 and d["results"][0]["naive"]["get_object"] >= 5
                 and "limits/" not in d["results"][0]["check"]["list_pages"]),
    # Kueue's baseline replayed at 20 jobs (2 owners, 2% of each class) and its two variants: a second or two
    "queue_scale.py": (["--owners", "2", "--fraction", "0.02"], "queue_scale.json",
                       lambda d: (d["jobs"], d["finished"], d["over_admitted"]) == (20, 20, 0)
                       and all(d["mean_admission_s"][k] is not None for k in ("small", "medium", "large"))
                       and d["store_calls_per_job"] > 0 and d["usage_percent"] > 0 and d["error_count"] == 0
                       and all(v["finished"] == 20 and v["over_admitted"] == 0 for v in d["variants"].values())),
    # one stop each way (the whole machine's /proc read before the signal, or the group's only) of the numpy loop
    "stop_time.py": (["--stops", "2", "--load", "0", "--idle", "0", "--mib", "1", "--threads", "1", "--workers", "1",
                      "--library", "numpy"],
                     "stop_time.json",
                     lambda d: [r["scan"] for r in d["stops"]] == ["whole", "group"]
                     and all(r["code"] == 143 and r["total_s"] > 0 and r["processes"] > 0 for r in d["stops"])),
    "sweep_reconcile.py": (["--cases", "3x2"], "sweep_reconcile.json",
                           lambda d: len(d["rows"]) == 2 and d["rows"][0]["cold"]["get"] > 0),
    "transfer.py": (["--endpoint", "moto", "--clouds", "s3", "gcs", "--tools", "jobplane", "--big-mib", "1",
                     "--files", "4", "--file-kib", "1", "--repeat", "1", "--out", "{out}/transfer.json"],
                    "transfer.json", _transfer_moved),
    "trials_plan.py": (["--repeat", "1", "--finished", "5", "--out", "{out}/trials_plan.json"], "trials_plan.json",
                       lambda d: sum(1 for r in d["rows"] if r.get("finished") == 5) == 7),
    "ui.py": (["--n", "5"], "ui.json", lambda d: d["results"][0]["warm_all"]["calls"]["list"] > 0
              and d["results"][0]["warm_all"]["bytes"] > 0),
}


# scripts whose tiny run is a test beside what they measure: "path::name"
ELSEWHERE = {"system_metrics.py": "tests/agent/test_system_metrics.py::test_the_sampling_bench_runs_at_a_tiny_size",
             "admission.py": "tests/control/launcher/test_admission_bench.py::"
                             "test_admission_costs_the_same_calls_with_3_or_12_jobs_waiting"}


def test_the_cold_start_bench_times_every_aws_handler_by_default() -> None:
    said = subprocess.run([sys.executable, str(BENCH / "cold_start.py"), "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT / "shared")), timeout=60)
    handlers = sorted(p.stem for p in (ROOT / "functions" / "aws").glob("*.py") if "def handler(" in p.read_text())
    assert said.returncode == 0 and f"default: {' '.join(handlers)}" in " ".join(said.stdout.split()), said.stdout


def test_every_bench_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")} - {"report.py", "render.py"}  # the two helpers measure nothing
    assert scripts == set(SMOKE) | set(ELSEWHERE)
    for where in ELSEWHERE.values():
        path, name = where.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), where


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_bench_script_measures_something_at_a_tiny_size(script: str, tmp_path: Path, warm: Warm) -> None:
    args, name, measured = SMOKE[script]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "shared"), JOBPLANE_BENCH_RESULTS=str(tmp_path))
    done = warm.run([sys.executable, str(BENCH / script), *(a.format(out=tmp_path) for a in args)], env=env,
                    cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stderr[-3000:]
    assert measured(json.loads((tmp_path / name).read_text())), (tmp_path / name).read_text()[:3000]


def test_the_benchmarks_page_is_what_the_committed_json_makes() -> None:
    spec = importlib.util.spec_from_file_location("bench_render", BENCH / "render.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    page = render.PAGE.read_text()
    blocks = set(render.BLOCK.findall(page))
    assert {b[1] for b in blocks} >= {"transfer-rclone", "transfer-gcs", "ui", "cold-start", "check", "queue_scale"}
    assert render.render(page) == page, "docs/benchmarks.md is not what bench/results/ makes: run bench/render.py"
