"""The CLI reaches the registry only through jobplane.sdk.

Statically: every module a file of shared/jobplane/cli/ imports (at the top, in a function, under TYPE_CHECKING,
or by importlib) is on the allow-list below, each entry with why it cannot reach a registry; no CLI file touches
a private attribute (an SDK object's registry is `_registry`); and none of the allowed jobplane modules imports
what builds a store or a cloud client. At run time: every registry, backend and Compute call the commands make has
an SDK frame between it and the command's.

The allow-list: the SDK; the CLI's own modules; the standard library; click and rich (the command line and the
terminal); PyYAML (printing a spec, reading --hp values); and jobplane modules that only parse or format values
they are given (no I/O): job views and status lines, metric tables and plots, cost text, the spec and policy
parsers, field errors, states, and the local cloud's own command group, which talks to `jobplane local up`
through its control socket, never to a registry.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobplane import backend, sdk
from jobplane.registry import Registry
from tests.test_cli_jobs import Cloud, Driver, cloud, reg, run  # noqa: F401  (the registry fixtures)
from tests.test_cli_metrics import falling, ship

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "shared" / "jobplane" / "cli"

ALLOWED = {
    "jobplane.sdk": "the SDK: every read and write of the registry, every call to the cloud",
    "jobplane.cli": "the CLI's own modules: connect (options, errors), follow (status line), params, the commands",
    "jobplane.jobview": "rows, table cells and status lines of a job view the SDK returned",
    "jobplane.metricview": "metric series (Metric.series) as table cells, summaries and sparklines",
    "jobplane.plot": "metrics --plot: a PNG of metric series, with matplotlib",
    "jobplane.cost": "a cost as money, JSON or an attempt's line; the groups `cost --by` takes",
    "jobplane.spec": "validate and schema: parsing a spec file; spec_to_json and durations as text",
    "jobplane.policy": "validate --policy: parsing a policy file and checking specs against it",
    "jobplane.errors": "validate: the field errors it prints",
    "jobplane.yaml_input": "--hp values read as bounded YAML",
    "jobplane.states": "State: exit codes, what describe shows",
    "jobplane.shell": "ssh: the argv of `aws ssm start-session` or `gcloud compute ssh` for the instance the SDK named",
    "jobplane.local.cli": "`jobplane local`: the local cloud's group, which talks to `local up` by its control "
                          "socket, not to a registry",
    "jobplane.local.control": "ssh on the local cloud: how `local up` enters a VM, asked by its control socket",
    "click": "the command line",
    "rich": "tables, the upload progress bar",
    "yaml": "describe prints a spec as YAML; --hp values",
}
# CLI files not on the SDK yet, and what they import beside the allow-list. An entry no longer needed fails.
PENDING = {
    "connect.py": {"jobplane.backend", "jobplane.jobs"},  # connect(), for ui.py below
    "ui.py": {"jobplane.ui.server", "uvicorn"},
}
# What builds a store or a cloud client: none of the allowed jobplane modules may import it.
BUILDERS = ("jobplane.backend", "jobplane.clouds", "jobplane.settings", "jobplane.jobs", "jobplane.sdk", "boto3",
            "botocore", "google")


def imported(source: str, package: str = "jobplane.cli") -> set[str]:
    """Every module the source imports, wherever the import stands; `from jobplane import x` counts as
    jobplane.x, a relative import as its module under package, importlib.import_module("m") and
    __import__("m") as m."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base == "__future__":
                continue
            found |= {f"{base}.{alias.name}" if base in ("jobplane", "jobplane.cli") else base for alias in node.names}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            found.add(node.args[0].value)
    return found


def allowed(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names or any(module == a or module.startswith(a + ".") for a in ALLOWED)


def private_uses(source: str) -> list[int]:
    """Lines that read a private attribute of something other than self or cls (`client._registry`), or get one
    by name (getattr(client, "_registry"))."""
    def private(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr.startswith("_") and not node.attr.endswith("__") \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("getattr", "setattr") and len(node.args) >= 2 \
            and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if private(node))


def cli_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(CLI.glob("*.py"))}


# ---- the checks ---------------------------------------------------------------------------------------------
def test_the_scanner_sees_every_way_of_importing() -> None:
    source = ("import json\nfrom jobplane import jobs, sdk\nfrom jobplane.registry import Registry\n"
              "from . import follow\nfrom .connect import client\n"
              "if TYPE_CHECKING:\n    from jobplane import backend\n"
              "def f():\n    import boto3\n    importlib.import_module('jobplane.settings')\n"
              "    __import__('google')\n")
    assert imported(source) == {"json", "jobplane.jobs", "jobplane.sdk", "jobplane.registry", "jobplane.cli.follow",
                                "jobplane.cli.connect", "jobplane.backend", "boto3", "jobplane.settings", "google"}
    assert [m for m in sorted(imported(source)) if not allowed(m)] == [
        "boto3", "google", "jobplane.backend", "jobplane.jobs", "jobplane.registry", "jobplane.settings"]
    assert private_uses("self._x\ncls._y\nclient._registry.get(1)\nx.__name__\ngetattr(job, '_client')\n") == [3, 5]


def test_the_cli_imports_only_the_sdk_and_what_formats_or_parses() -> None:
    files = cli_files()
    assert {"__init__.py", "jobs.py", "reports.py", "connect.py", "follow.py"} <= set(files)
    wrong = {name: sorted(m for m in imported(text) if not allowed(m) and m not in PENDING.get(name, set()))
             for name, text in files.items()}
    assert {name: mods for name, mods in wrong.items() if mods} == {}, \
        "a CLI file imports what may reach the registry: go through jobplane.sdk (or say why in ALLOWED)"
    stale = {name: sorted(extra - imported(files[name])) for name, extra in PENDING.items() if name in files}
    assert {name: mods for name, mods in stale.items() if mods} == {}, "drop what is no longer imported from PENDING"


def test_no_cli_file_touches_a_private_attribute() -> None:
    found = {name: lines for name, text in cli_files().items() if (lines := private_uses(text))}
    assert found == {}


@pytest.mark.parametrize("module", sorted(m for m in ALLOWED if m.startswith("jobplane.") and m not in
                                          ("jobplane.sdk", "jobplane.cli")))
def test_no_allowed_module_imports_what_builds_a_store(module: str) -> None:
    path = ROOT / "shared" / (module.replace(".", "/") + ".py")
    builders = sorted(m for m in imported(path.read_text(), module.rpartition('.')[0]) if m.startswith(BUILDERS))
    assert builders == [], f"{module} is on the CLI's allow-list but imports {builders}"


# ---- at run time ------------------------------------------------------------------------------------------------
Calls = list[tuple[str, bool]]


def through_the_sdk(frame: Any) -> bool:
    """From the call outwards: an SDK frame comes before any CLI frame (a call from neither, a test's driver say,
    passes)."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith("jobplane.sdk"):
            return True
        if name.startswith("jobplane.cli"):
            return False
        frame = frame.f_back
    return True


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every public Registry method, jobplane.backend's builders and every Compute adapter method, recording
    (what, whether the SDK was between it and the CLI)."""
    calls: Calls = []

    def spy(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append((what, through_the_sdk(sys._getframe(1))))
            return fn(*args, **kwargs)
        return wrapper

    from jobplane.clouds.aws import Ec2Compute
    from jobplane.clouds.gcp import GceCompute

    for cls in (Registry, Ec2Compute, GceCompute):
        for name, fn in vars(cls).items():
            if inspect.isfunction(fn) and not name.startswith("_"):
                monkeypatch.setattr(cls, name, spy(f"{cls.__name__}.{name}", fn))
    for name in ("connect", "registry", "compute"):
        monkeypatch.setattr(backend, name, spy(f"backend.{name}", getattr(backend, name)))
    yield calls


def test_the_check_at_run_time_catches_a_command_that_reaches_around_the_sdk(watched: Calls) -> None:
    around: dict[str, Any] = {"__name__": "jobplane.cli.sneaky", "sdk": sdk}
    exec("def sneaky(reg):\n    return reg.key('x')\n", around)
    around["sneaky"](Registry(None, ""))  # type: ignore[arg-type]
    assert watched == [("Registry.key", False)]


@pytest.mark.parametrize("cloud", ["aws", "gcp"], indirect=True)
def test_every_command_reaches_the_registry_and_the_cloud_through_the_sdk(
        cloud: Cloud, reg: Registry, watched: Calls, tmp_path: Path) -> None:  # noqa: F811
    spec, code = tmp_path / "job.yaml", tmp_path / "src"
    spec.write_text(cloud.spec("id: seen\n"))
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    driver = Driver(reg, "seen", None)
    driver.start()
    assert run("submit", str(spec), "--code", str(code)).exit_code == 0
    assert run("wait", "seen", "--for", "running", "--interval", "0.05").exit_code == 0
    driver.finish()
    ship(reg, "seen", 1, 0, 0, falling(range(10, 30, 10)))
    for command in (["ls"], ["ls", "--all", "--json"], ["describe", "seen"], ["describe", "seen", "--json"],
                    ["logs", "seen"], ["metrics", "seen"], ["metrics", "seen", "--json"], ["cost"],
                    ["cost", "--json", "--by", "owner"], ["sweep", "ls", "--all", "--json"],
                    ["cancel", "seen", "--force"], ["logs", "seen", "-f"], ["wait", "seen"]):
        result = run(*command)
        assert result.exit_code in (0, 3), (command, result.output)
    assert json.loads(run("ls", "--all", "--json").stdout)[0]["state"] == "CANCELLED"
    from_cli = [what for what, ok in watched if not ok]
    assert from_cli == [], f"reached without the SDK: {sorted(set(from_cli))}"
    reached = {what for what, _ in watched}
    assert {"backend.connect", "Registry.job", "Registry.listing", "Registry.transition"} <= reached
    assert any(what.endswith(("Compute.list_managed", "Compute.terminate")) for what in reached), reached
    assert yaml.safe_load(reg.get_bytes("jobs/seen/job.json"))["state"] == "CANCELLED"
