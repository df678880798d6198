"""tests/budgets.json covers the suite: every test module (tests/infra/ as one unit) has its tier and budget, and
every entry is a module that exists; the scheduler orders the units by their recorded seconds, and a free worker
takes, of the longest left, the one whose CPU rate best fills the cores."""

from __future__ import annotations

import json
from pathlib import Path

from tests import scheduling

TESTS = Path(__file__).resolve().parent


def test_every_unit_has_a_tier_and_a_budget_and_every_entry_exists() -> None:
    units = scheduling.load()
    on_disk = {scheduling.unit(p.relative_to(TESTS.parent).as_posix()) for p in TESTS.rglob("test_*.py")}
    assert sorted(on_disk - units.keys()) == [], "add these to tests/budgets.json with a tier and a budget"
    assert sorted(units.keys() - on_disk) == [], "these entries of tests/budgets.json name no test module"
    assert all(u.budget > 0 and u.seconds >= 0 for u in units.values())


def test_the_longest_units_go_first_and_unknown_ones_early() -> None:
    budgets = scheduling.Budgets.__new__(scheduling.Budgets)
    budgets.units = {"tests/a.py": scheduling.Unit("check", 10, 2.0), "tests/b.py": scheduling.Unit("check", 90, 80)}
    order = sorted(["tests/a.py", "tests/new.py", "tests/b.py"], key=lambda u: -budgets.expected(u))
    assert order == ["tests/b.py", "tests/new.py", "tests/a.py"]


def _units(**rates: tuple[float, float]) -> dict[str, scheduling.Unit]:
    return {name: scheduling.Unit("scenario", 120, seconds, cpu) for name, (seconds, cpu) in rates.items()}


def test_a_free_worker_takes_of_the_longest_left_the_one_that_fills_the_idle_cores() -> None:
    units = _units(a=(100, 80), b=(90, 20), c=(80, 50), d=(60, 60), tiny=(10, 10), busy=(100, 150), full=(100, 200))
    queue = ["a", "b", "c", "d", "tiny"]  # rates 0.8, 0.22, 0.62, 1.0 and 1.0; tiny is past the window of 4
    assert scheduling.pick(queue, [], units, cores=2) == "d"  # nothing runs: the busiest
    assert scheduling.pick(queue, ["busy"], units, cores=2) == "c"  # 0.5 idle: 0.62 is the nearest
    assert scheduling.pick(queue, ["full"], units, cores=2) == "b"  # none idle: the one that waits most
    assert scheduling.pick(["a", "b"], ["busy"], units, cores=2) == "b"  # 0.5 idle: 0.28 off beats 0.3 off
    assert scheduling.pick(queue, [], units, cores=2, passed_over=scheduling.PASSES) == "a"  # its turn, at last


def test_only_units_half_as_long_as_the_longest_left_are_taken_out_of_order() -> None:
    units = _units(long=(100, 10), short=(40, 40))
    assert scheduling.pick(["long", "short"], [], units, cores=2) == "long"  # short is busier, but too short
    assert scheduling.pick(["new", "long"], [], units, cores=2) == "long"  # an unknown unit counts as waiting
    assert scheduling.pick(["new"], [], units, cores=2) == "new"


def test_recording_keeps_tiers_and_budgets_and_writes_seconds_and_cpu(tmp_path: Path) -> None:
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps({"units": {"tests/a.py": {"tier": "scenario", "budget": 90, "seconds": 1.0}}}))
    scheduling.record({"tests/a.py": 50.04, "tests/b.py": 2.0}, {"tests/a.py": 20.26}, path)
    units = scheduling.load(path)
    assert units["tests/a.py"] == scheduling.Unit("scenario", 90, 50.0, 20.3)
    assert units["tests/b.py"] == scheduling.Unit("check", scheduling.UNKNOWN_SECONDS, 2.0, 0.0)
    assert units["tests/a.py"].rate == 20.3 / 50.0
