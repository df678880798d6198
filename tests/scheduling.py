"""How `make test` spreads the suite over pytest-xdist workers (`--dist loadscope`), and what each unit of it costs.

Most tests wait (on a local cloud's processes, a moto server, a subprocess), so 4 workers overlap well even on
2 cores. Each test module is one unit of work, so a module-scoped local cloud starts once; the CDK tests are one
unit, because their session-scoped synth costs ~20 s of CPU and would otherwise run once per worker.

tests/budgets.json records every unit's tier, its time budget and its duration in a quiet run:
- the scheduler hands the units out longest first (by the recorded durations), so no worker is left alone with a
  long one at the end;
- `--tier check` keeps only the check tier (`make check`: the pure tests and the days on the manual clock); the
  scenario tier (real processes, local clouds, the browser) runs in `make test` only;
- the run ends with the slowest units beside their budgets; a unit over twice its budget, or missing from the
  file, gets a line a reviewer sees (never a failure: a loaded machine is slower);
- `--record-durations` writes this run's durations into the file (keeping the tiers and budgets).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BUDGETS = Path(__file__).with_name("budgets.json")
TIERS = ("check", "integration", "scenario")
UNKNOWN_SECONDS = 60.0  # an unrecorded unit is scheduled as if it were this long: early rather than last
SHOWN = 12  # units in the table at the end


@dataclass(frozen=True)
class Unit:
    tier: str
    budget: float  # seconds
    seconds: float  # in the last recorded quiet run


def load(path: Path = BUDGETS) -> dict[str, Unit]:
    doc = json.loads(path.read_text())
    units = {name: Unit(**fields) for name, fields in doc["units"].items()}
    bad = {name: u.tier for name, u in units.items() if u.tier not in TIERS}
    if bad:
        raise ValueError(f"{path}: unknown tiers {bad} (one of {TIERS})")
    return units


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: tests/infra/ as a whole, else its module."""
    path = nodeid.split("::", 1)[0]
    return "tests/infra/" if path.startswith("tests/infra/") else path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jobplane")
    group.addoption("--tier", choices=TIERS, help="only the units of this tier (tests/budgets.json)")
    group.addoption("--record-durations", action="store_true", help="write this run's unit durations to "
                                                                     "tests/budgets.json")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Budgets(config, load()), "jobplane-budgets")


class Budgets:
    def __init__(self, config: pytest.Config, units: dict[str, Unit]) -> None:
        self.config, self.units = config, units
        self.spent: defaultdict[str, float] = defaultdict(float)  # unit -> seconds of setup, call and teardown

    def expected(self, name: str) -> float:
        return self.units[name].seconds if name in self.units else UNKNOWN_SECONDS

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        """With --tier, another tier's modules are not even imported."""
        tier = config.getoption("tier")
        if tier is None:
            return None
        rel = collection_path.relative_to(config.rootpath).as_posix() + ("/" if collection_path.is_dir() else "")
        known = self.units.get(rel if rel == "tests/infra/" else unit(rel))
        return True if known is not None and known.tier != tier else None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Every worker collects the same order (sorted is stable), and the scheduler hands units out in it."""
        tier = config.getoption("tier")
        if tier is not None:
            kept = [i for i in items if self.units.get(unit(i.nodeid), Unit("check", 0, 0)).tier == tier]
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept
        items.sort(key=lambda item: -self.expected(unit(item.nodeid)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[unit(report.nodeid)] += report.duration

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist") != "loadscope":
            return None  # another --dist: xdist's own scheduler
        from xdist.scheduler import LoadScopeScheduling

        class ByUnit(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return unit(nodeid)

        config.option.loadscopereorder = False  # keep the order above, not "most tests first"
        return ByUnit(config, log)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.spent or hasattr(self.config, "workerinput"):
            return
        write = terminalreporter.write_line
        terminalreporter.section("time per unit (tests/budgets.json)")
        write(f"{'seconds':>8} {'budget':>7} {'recorded':>9}  unit")
        for name, spent in sorted(self.spent.items(), key=lambda kv: -kv[1])[:SHOWN]:
            u = self.units.get(name)
            write(f"{spent:8.1f} {u.budget if u else float('nan'):7.0f} {u.seconds if u else float('nan'):9.1f}  "
                  f"{name}")
        for name, spent in sorted(self.spent.items()):
            u = self.units.get(name)
            if u is None:
                write(f"NO BUDGET: {name} took {spent:.1f} s and is not in tests/budgets.json (add it with its tier)")
            elif spent > 2 * u.budget:
                write(f"OVER BUDGET: {name} took {spent:.1f} s, over twice its budget of {u.budget:.0f} s")
        if self.config.getoption("record_durations"):
            record(self.spent)
            write(f"recorded the durations of {len(self.spent)} units in {BUDGETS}")


def record(spent: dict[str, float], path: Path = BUDGETS) -> None:
    doc = json.loads(path.read_text())
    for name, seconds in spent.items():
        entry = doc["units"].setdefault(name, {"tier": "check", "budget": UNKNOWN_SECONDS, "seconds": 0.0})
        entry["seconds"] = round(seconds, 1)
    doc["units"] = dict(sorted(doc["units"].items()))
    path.write_text(json.dumps(doc, indent=1) + "\n")
