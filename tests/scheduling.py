"""How `make test` spreads the suite over pytest-xdist workers (`--dist loadscope`), and what each unit of it costs.

Most tests wait (on a local cloud's processes, a moto server, a subprocess), so 4 workers overlap well even on
2 cores. Each test module is one unit of work, so a module-scoped local cloud starts once; the CDK tests are one
unit, because their session-scoped synth costs ~20 s of CPU and would otherwise run once per worker.

A unit costs seconds (setup, call and teardown of its tests) and CPU seconds: user + sys of the worker and every
process under it while the unit ran (tests/cpu.py). CPU is what the two cores share, and it varies less than
seconds between machines and loads. tests/budgets.json records every unit's tier, its budgets (seconds and CPU
seconds) and what it cost in a quiet run:
- the scheduler hands the units out longest first (by the recorded seconds), so no worker is left alone with a
  long one at the end;
- `--tier check` keeps only the check tier (`make check`: the pure tests and the days on the manual clock); the
  scenario tier (real processes, local clouds, the browser) runs in `make test` only;
- the run ends with the costliest units beside their budgets, and the run's CPU outside them (each worker's start
  and collection, the controller); a unit over twice either budget, or missing from the file, gets a line a
  reviewer sees (never a failure: a loaded machine is slower);
- `--record-durations` writes this run's seconds and CPU seconds into the file (keeping the tiers and budgets).
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests import cpu

BUDGETS = Path(__file__).with_name("budgets.json")
TIERS = ("check", "integration", "scenario")
UNKNOWN_SECONDS = 60.0  # an unrecorded unit is scheduled as if it were this long: early rather than last
SHOWN = 12  # units in the table at the end, the costliest by seconds and by CPU


@dataclass(frozen=True)
class Unit:
    tier: str
    budget: float  # seconds
    seconds: float  # in the last recorded quiet run
    cpu_budget: float  # CPU seconds
    cpu: float  # CPU seconds in the last recorded quiet run


def load(path: Path = BUDGETS) -> dict[str, Unit]:
    doc = json.loads(path.read_text())
    units = {name: Unit(**fields) for name, fields in doc["units"].items()}
    bad = {name: u.tier for name, u in units.items() if u.tier not in TIERS}
    if bad:
        raise ValueError(f"{path}: unknown tiers {bad} (one of {TIERS})")
    return units


@cache
def shares_clouds(name: str) -> frozenset[str]:
    """The local clouds a unit hands on to the next one on its worker (its module's SHARES_CLOUDS, read from its
    source: the controller imports no test module)."""
    path = Path(__file__).parent.parent / name
    if not name.endswith(".py") or not path.is_file():
        return frozenset()
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SHARES_CLOUDS"]
                and isinstance(node.value, ast.Tuple)):
            return frozenset(str(e.value) for e in node.value.elts if isinstance(e, ast.Constant))
    return frozenset()


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: tests/infra/ as a whole, else its module."""
    path = nodeid.split("::", 1)[0]
    return "tests/infra/" if path.startswith("tests/infra/") else path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jobplane")
    group.addoption("--tier", choices=TIERS, help="only the units of this tier (tests/budgets.json)")
    group.addoption("--record-durations", action="store_true", help="write this run's unit seconds and CPU "
                                                                     "seconds to tests/budgets.json")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Budgets(config, load()), "jobplane-budgets")
    config.pluginmanager.register(CpuMeter(config), "jobplane-cpu")


class CpuMeter:
    """Where tests run (a worker, or the one process without xdist): the CPU seconds each unit spent, on the
    teardown report of its last test (a report carries extra attributes to the controller). Sampled where the unit
    changes: /proc is read once a unit, not once a test."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.mark: float | None = None  # CPU seconds when the running unit began
        self.next: pytest.Item | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        if self.mark is None:
            self.mark = cpu.spent()
        self.next = nextitem
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        outcome = yield
        if call.when != "teardown" or self.mark is None:
            return
        if self.next is not None and unit(self.next.nodeid) == unit(item.nodeid):
            return
        now = cpu.spent()  # the next unit begins here: the time between two units is the next one's
        outcome.get_result().cpu = now - self.mark
        self.mark = now


class Budgets:
    def __init__(self, config: pytest.Config, units: dict[str, Unit]) -> None:
        self.config, self.units = config, units
        self.spent: defaultdict[str, float] = defaultdict(float)  # unit -> seconds of setup, call and teardown
        self.cpu: defaultdict[str, float] = defaultdict(float)  # unit -> CPU seconds

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
            kept = [i for i in items if self.units.get(unit(i.nodeid), Unit("check", 0, 0, 0, 0)).tier == tier]
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept
        items.sort(key=lambda item: -self.expected(unit(item.nodeid)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[unit(report.nodeid)] += report.duration
        self.cpu[unit(report.nodeid)] += getattr(report, "cpu", 0.0)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist") != "loadscope":
            return None  # another --dist: xdist's own scheduler
        from xdist.scheduler import LoadScopeScheduling

        class ByUnit(LoadScopeScheduling):  # type: ignore[misc]
            def __init__(self, config: pytest.Config, log: Any) -> None:
                super().__init__(config, log)
                self.last: dict[Any, str] = {}  # worker -> the unit it was handed last

            def _split_scope(self, nodeid: str) -> str:
                return unit(nodeid)

            def _assign_work_unit(self, node: Any) -> None:
                """The next unit in order, unless one that takes over the local cloud the worker's last unit hands
                on waits (tests/local/conftest.Kept): that one goes first, so the cloud starts once for both."""
                handed = shares_clouds(self.last.get(node, ""))
                if handed:
                    taker = next((name for name in self.workqueue if shares_clouds(name) & handed), None)
                    if taker is not None:
                        self.workqueue.move_to_end(taker, last=False)
                self.last[node] = next(iter(self.workqueue))
                super()._assign_work_unit(node)

        config.option.loadscopereorder = False  # keep the order above, not "most tests first"
        return ByUnit(config, log)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.spent or hasattr(self.config, "workerinput"):
            return
        write = terminalreporter.write_line
        terminalreporter.section("cost per unit (tests/budgets.json)")
        write(f"{'seconds':>8} {'budget':>7} {'recorded':>9} {'CPU s':>8} {'budget':>7} {'recorded':>9}  unit")
        nan = float("nan")
        shown = set(sorted(self.spent, key=lambda n: -self.spent[n])[:SHOWN]) | set(
            sorted(self.cpu, key=lambda n: -self.cpu[n])[:SHOWN])
        for name in sorted(shown, key=lambda n: -self.spent[n]):
            u = self.units.get(name)
            write(f"{self.spent[name]:8.1f} {u.budget if u else nan:7.0f} {u.seconds if u else nan:9.1f} "
                  f"{self.cpu[name]:8.1f} {u.cpu_budget if u else nan:7.0f} {u.cpu if u else nan:9.1f}  {name}")
        units_cpu, total = sum(self.cpu.values()), cpu.spent()  # the workers have ended by now
        write(f"{sum(self.spent.values()):8.1f} {'':17} {units_cpu:8.1f} {'':17}  all {len(self.spent)} units; "
              f"{total - units_cpu:.1f} CPU s more outside them (starting and collecting, the controller): "
              f"{total:.1f} in all")
        for name in sorted(self.spent):
            u = self.units.get(name)
            if u is None:
                write(f"NO BUDGET: {name} took {self.spent[name]:.1f} s and {self.cpu[name]:.1f} CPU s and is not "
                      f"in tests/budgets.json (add it with its tier)")
                continue
            if self.spent[name] > 2 * u.budget:
                write(f"OVER BUDGET: {name} took {self.spent[name]:.1f} s, over twice its budget of {u.budget:.0f} s")
            if self.cpu[name] > 2 * u.cpu_budget:
                write(f"OVER BUDGET: {name} took {self.cpu[name]:.1f} CPU s, over twice its budget of "
                      f"{u.cpu_budget:.0f} CPU s")
        if self.config.getoption("record_durations"):
            record(self.spent, self.cpu)
            write(f"recorded the seconds and CPU seconds of {len(self.spent)} units in {BUDGETS}")


def record(spent: dict[str, float], cpu_spent: dict[str, float], path: Path = BUDGETS) -> None:
    doc = json.loads(path.read_text())
    for name, seconds in spent.items():
        entry = doc["units"].setdefault(name, {"tier": "check", "budget": UNKNOWN_SECONDS, "seconds": 0.0,
                                               "cpu_budget": UNKNOWN_SECONDS, "cpu": 0.0})
        entry["seconds"] = round(seconds, 1)
        entry["cpu"] = round(cpu_spent.get(name, 0.0), 1)
    doc["units"] = dict(sorted(doc["units"].items()))
    path.write_text(json.dumps(doc, indent=1) + "\n")
