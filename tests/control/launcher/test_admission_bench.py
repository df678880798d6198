"""bench/admission.py at a tiny size: what it measures holds, and the calls per admission and per pass do not grow
with the jobs waiting (the bench's own figures are in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_admission", ROOT / "bench" / "admission.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {run: result[run]["calls"] for run in ("admit", "refuse", "check", "backstop", "slot_freed")}


def test_admission_costs_the_same_calls_with_3_or_12_jobs_waiting() -> None:
    measure = bench().measure
    few, more = measure(3), measure(12)
    assert calls(few) == calls(more)
    assert few["admit"]["admission"] == 2, "one GET and one compare-and-swap of the owner's record"
    assert few["backstop"]["job_record_gets"] == 0, "no retry of a job waiting in line"
    assert few["check"]["job_record_gets"] == 1, "the one job launching; none for the healthy or the waiting"
    assert few["next_launched_after_s"] == 0.0, "the check that ended a job launched the next"
    assert few["record_bytes"] < more["record_bytes"] < 12 * 300
    later, told = few["check_later"], few["check_budget_told"]
    assert (told["calls"]["LIST"], told["job_record_gets"]) == (later["calls"]["LIST"] + 1, later["job_record_gets"]), \
        "an owner past a level of its budget: one listing of the month's notices a check, no job read"
    assert few["check_budget_due"]["total"] == few["check_budget_told"]["total"] + 1, "the notice's marker, once"
