"""How `make test` spreads the suite over pytest-xdist workers (`--dist loadscope`).

Most tests wait (on a local cloud's processes, a moto server, a subprocess), so 4 workers overlap well even on
2 cores. Each test module is one unit of work, so a module-scoped local cloud starts once; the CDK tests are one
unit, because their session-scoped synths cost ~20 s of CPU each and would otherwise run once per worker. The
longest units are handed out first, so no worker is left alone with one of them at the end.
"""

from __future__ import annotations

from typing import Any

import pytest

# One unit each, in this order, before everything else (longest first, from `pytest --durations`).
FIRST = (
    "tests/local/test_sweep_scenario.py",
    "tests/infra/",
    "tests/ui/test_browser.py",
    "tests/local/test_sdk_notebook.py",
    "tests/local/test_checkpoint_habits.py",
    "tests/local/test_reconcile_scenarios.py",
    "tests/reconcile/test_chaos.py",
    "tests/gcp/test_scenarios.py",
    "tests/local/test_training.py",
    "tests/test_cli_jobs.py",
    "tests/test_store_conformance.py",
    "tests/local/test_gce_runner.py",
    "tests/local/test_job_isolation.py",
    "tests/local/",
)


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: tests/infra/ as a whole, else its module."""
    path = nodeid.split("::", 1)[0]
    return "tests/infra/" if path.startswith("tests/infra/") else path


def rank(nodeid: str) -> int:
    path = unit(nodeid)
    return next((i for i, first in enumerate(FIRST) if path.startswith(first)), len(FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every worker collects the same order (sorted is stable), and the scheduler hands units out in it."""
    items.sort(key=lambda item: rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None  # another --dist: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    config.option.loadscopereorder = False  # keep the order above, not "most tests first"
    return ByUnit(config, log)
