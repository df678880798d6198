"""tests/budgets.json covers the suite: every test module (tests/infra/ as one unit) has its tier and budget, and
every entry is a module that exists; the scheduler orders the units by their recorded seconds."""

from __future__ import annotations

from pathlib import Path

from tests import scheduling

TESTS = Path(__file__).resolve().parent


def test_every_unit_has_a_tier_and_a_budget_and_every_entry_exists() -> None:
    units = scheduling.load()
    on_disk = {scheduling.unit(p.relative_to(TESTS.parent).as_posix()) for p in TESTS.rglob("test_*.py")}
    assert sorted(on_disk - units.keys()) == [], "add these to tests/budgets.json with a tier and a budget"
    assert sorted(units.keys() - on_disk) == [], "these entries of tests/budgets.json name no test module"
    assert all(u.budget > 0 and u.seconds >= 0 and u.cpu_budget > 0 and u.cpu >= 0 for u in units.values())


def test_the_longest_units_go_first_and_unknown_ones_early() -> None:
    budgets = scheduling.Budgets.__new__(scheduling.Budgets)
    budgets.units = {"tests/a.py": scheduling.Unit("check", 10, 2.0, 10, 1.0),
                     "tests/b.py": scheduling.Unit("check", 90, 80, 90, 40)}
    order = sorted(["tests/a.py", "tests/new.py", "tests/b.py"], key=lambda u: -budgets.expected(u))
    assert order == ["tests/b.py", "tests/new.py", "tests/a.py"]
