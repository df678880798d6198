"""The CLI reaches the registry only through jobplane.sdk.

Statically: every module a file of shared/jobplane/cli/ imports (at the top, in a function, under TYPE_CHECKING,
or by importlib) is on the allow-list below, each entry with why it cannot reach a registry; so is every module
the dashboard `jobplane ui` serves imports (jobplane.ui's server and what it imports of jobplane.ui), with the web
libraries beside; no file of either touches a private attribute (an SDK object's registry is `_registry`); and
none of the allowed jobplane modules imports what builds a store or a cloud client. At run time: every registry,
backend and Compute call the commands make (and the dashboard's pages, each page asked for) has an SDK frame
between it and the command's or the dashboard's.

The allow-list: the SDK; the CLI's own modules; the standard library; click and rich (the command line and the
terminal); PyYAML (printing a spec, reading --hp values); and jobplane modules that only parse or format values
they are given (no I/O): job views and status lines, metric tables and plots, cost text, the spec and policy
parsers, durations, field errors, states, and the local cloud's own command group, which talks to `jobplane local up`
through its control socket, never to a registry.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobplane import sdk
from jobplane.ops import backend
from jobplane.store.registry import Registry
from jobplane.store.rooted import RootedStore
from tests.cli.helpers import run
from tests.helpers import falling, ship
from tests.helpers import imported as scanned
from tests.registry_clouds import Driver, RegistryCloud

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "shared" / "jobplane" / "cli"

ALLOWED = {
    "jobplane.sdk": "the SDK: every read and write of the registry, every call to the cloud",
    "jobplane.cli": "the CLI's own modules: connect (options, errors), follow (status line), params, the commands",
    "jobplane.views.jobview": "rows, table cells and status lines of a job view the SDK returned",
    "jobplane.views.metricview": "metric series (Metric.series) as table cells, summaries and sparklines",
    "jobplane.views.plot": "metrics --plot: a PNG of metric series, with matplotlib",
    "jobplane.views.cost": "a cost as money, JSON or an attempt's line; the groups `cost --by` takes",
    "jobplane.views.events": "a job's events (Job.events) as one readable line each",
    "jobplane.model.spec": "validate and schema: parsing a spec file; spec_to_json",
    "jobplane.model.bounds": "durations: --since and --timeout values parsed, waits and limits as text",
    "jobplane.model.policy": "validate --policy: parsing a policy file and checking specs against it",
    "jobplane.model.errors": "validate: the field errors it prints",
    "jobplane.model.yaml_input": "--hp values read as bounded YAML",
    "jobplane.model.states": "State: exit codes, what describe shows",
    "jobplane.model.clock": "utcnow: the wall clock in UTC (the standard library only)",
    "jobplane.sweeps.record": "an array's record: the model of what Sweep.record returns (ls and describe show it)",
    "jobplane.local.cli": "`jobplane local`: the local cloud's group, which talks to `local up` by its control "
                          "socket, not to a registry",
    "jobplane.local.control": "ssh on the local cloud: how `local up` enters a VM, asked by its control socket",
    "jobplane.ui": "the dashboard `jobplane ui` serves: its pages read the registry through the Client it is given "
                   "(its modules are held to this list too, UI_ALLOWED beside)",
    "uvicorn": "serves the dashboard",
    "click": "the command line",
    "rich": "tables, the upload progress bar",
    "yaml": "describe prints a spec as YAML; --hp values",
}
# What the dashboard's modules may import beside ALLOWED.
UI_ALLOWED = {
    "starlette": "the web app: routes, requests, responses, static files",
    "jinja2": "the pages' templates",
    "jobplane.model.jobrecord": "job.json's model: the record of a job view the SDK returned",
    "jobplane.model.metrics": "STEP, the metric a chart's x axis is",
    "jobplane.views.sysview": "system metric series (Metric.series) as one chart per kind",
    "jobplane.sweeps.record": "a sweep's record: the model of what Sweep.record returns",
}
UI = ROOT / "shared" / "jobplane" / "ui"
# What builds a store or a cloud client: none of the allowed jobplane modules may import it.
BUILDERS = ("jobplane.ops", "jobplane.store", "jobplane.clouds", "jobplane.settings", "jobplane.sdk", "boto3",
            "botocore", "google")


def imported(source: str, package: str = "jobplane.cli") -> set[str]:
    """Every module the source imports, wherever the import stands; `from jobplane.x import y` counts as
    jobplane.x.y where that is a module, a relative import as its module under package, importlib.import_module("m")
    and __import__("m") as m."""
    return scanned(source, package, in_package)


def in_package(module: str) -> bool:
    path = ROOT / "shared" / module.replace(".", "/")
    return module.startswith("jobplane.") and (path.with_suffix(".py").exists() or path.is_dir())


def allowed(module: str, beside: dict[str, str] | None = None) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names or any(module == a or module.startswith(a + ".")
                                                 for a in (*ALLOWED, *(beside or {})))


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


def ui_files() -> dict[str, str]:
    """The dashboard's modules `jobplane ui` imports: jobplane.ui.server and, in turn, what it imports of
    jobplane.ui (not jobplane.local.dashboard, which `jobplane local up` runs it with)."""
    found: dict[str, str] = {}
    todo = sorted(m for text in cli_files().values() for m in imported(text) if m.startswith("jobplane.ui."))
    while todo:
        module = todo.pop()
        name = module.removeprefix("jobplane.ui.") + ".py"
        if name not in found and (UI / name).exists():
            found[name] = (UI / name).read_text()
            todo += [m for m in imported(found[name], "jobplane.ui") if m.startswith("jobplane.ui.")]
    return found


# ---- the checks ---------------------------------------------------------------------------------------------
def test_the_scanner_sees_every_way_of_importing() -> None:
    source = ("import json\nfrom jobplane import sdk\nfrom jobplane.ops import jobs\n"
              "from jobplane.store.registry import Registry\nfrom . import follow\nfrom .connect import client\n"
              "if TYPE_CHECKING:\n    from jobplane.ops import backend\n"
              "def f():\n    import boto3\n    importlib.import_module('jobplane.settings')\n"
              "    __import__('google')\n")
    assert imported(source) == {"json", "jobplane.ops.jobs", "jobplane.sdk", "jobplane.store.registry",
                                "jobplane.cli.follow", "jobplane.cli.connect", "jobplane.ops.backend", "boto3",
                                "jobplane.settings", "google"}
    assert [m for m in sorted(imported(source)) if not allowed(m)] == [
        "boto3", "google", "jobplane.ops.backend", "jobplane.ops.jobs", "jobplane.settings", "jobplane.store.registry"]
    assert private_uses("self._x\ncls._y\nclient._registry.get(1)\nx.__name__\ngetattr(job, '_client')\n") == [3, 5]


def test_the_cli_imports_only_the_sdk_and_what_formats_or_parses() -> None:
    files = cli_files()
    assert {"__init__.py", "jobs.py", "reports.py", "connect.py", "follow.py", "ui.py"} <= set(files)
    wrong = {name: sorted(m for m in imported(text) if not allowed(m)) for name, text in files.items()}
    assert {name: mods for name, mods in wrong.items() if mods} == {}, \
        "a CLI file imports what may reach the registry: go through jobplane.sdk (or say why in ALLOWED)"


def test_the_dashboard_imports_only_the_sdk_and_what_formats_or_serves() -> None:
    files = ui_files()
    assert {"server.py", "data.py"} <= set(files) and "beside.py" not in files
    wrong = {name: sorted(m for m in imported(text, "jobplane.ui") if not allowed(m, UI_ALLOWED))
             for name, text in files.items()}
    assert {name: mods for name, mods in wrong.items() if mods} == {}, \
        "a dashboard module imports what may reach the registry: go through jobplane.sdk (or say why in UI_ALLOWED)"


def test_no_cli_or_dashboard_file_touches_a_private_attribute() -> None:
    found = {name: lines for name, text in (cli_files() | {f"ui/{n}": t for n, t in ui_files().items()}).items()
             if (lines := private_uses(text))}
    assert found == {}


@pytest.mark.parametrize("module", sorted(m for m in (*ALLOWED, *UI_ALLOWED) if m.startswith("jobplane.") and m not in
                                          ("jobplane.sdk", "jobplane.cli", "jobplane.ui")))
def test_no_allowed_module_imports_what_builds_a_store(module: str) -> None:
    path = ROOT / "shared" / (module.replace(".", "/") + ".py")
    builders = sorted(m for m in imported(path.read_text(), module.rpartition('.')[0]) if m.startswith(BUILDERS))
    assert builders == [], f"{module} is on the CLI's allow-list but imports {builders}"


# ---- at run time ------------------------------------------------------------------------------------------------
Calls = list[tuple[str, bool]]


def through_the_sdk(frame: Any) -> bool:
    """From the call outwards: an SDK frame comes before any CLI or dashboard frame (a call from neither, a test's
    driver say, passes)."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith("jobplane.sdk"):
            return True
        if name.startswith(("jobplane.cli", "jobplane.ui")):
            return False
        frame = frame.f_back
    return True


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every public RootedStore and Registry method, jobplane.ops.backend's builders and every Compute adapter
    method, recording (what, whether the SDK was between it and the CLI)."""
    calls: Calls = []

    def spy(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append((what, through_the_sdk(sys._getframe(1))))
            return fn(*args, **kwargs)
        return wrapper

    from jobplane.clouds.aws import Ec2Compute
    from jobplane.clouds.gcp import GceCompute

    for cls in (RootedStore, Registry, Ec2Compute, GceCompute):
        for name, fn in vars(cls).items():
            if inspect.isfunction(fn) and not name.startswith("_"):
                monkeypatch.setattr(cls, name, spy(f"{cls.__name__}.{name}", fn))
    for name in ("connect", "registry", "compute"):
        monkeypatch.setattr(backend, name, spy(f"backend.{name}", getattr(backend, name)))
    yield calls


def test_the_check_at_run_time_catches_a_command_that_reaches_around_the_sdk(watched: Calls) -> None:
    for module in ("jobplane.cli.sneaky", "jobplane.ui.sneaky"):
        around: dict[str, Any] = {"__name__": module, "sdk": sdk}
        exec("def sneaky(reg):\n    return reg.key('x')\n", around)
        around["sneaky"](Registry(None, ""))  # type: ignore[arg-type]
    assert watched == [("RootedStore.key", False)] * 2


PAGES = ("/", "/?all=1", "/fragments/jobs", "/jobs/seen", "/jobs/seen/status", "/jobs/seen/files",
         "/jobs/seen/logs?attempt=1&rank=0", "/jobs/seen/metrics.json", "/compare?id=seen", "/cost?period=all",
         "/sweeps?all=1")


def browse(monkeypatch: pytest.MonkeyPatch, cancel: str) -> dict[str, int]:
    """`jobplane ui`, its server replaced by a client that asks for each of PAGES and cancels a job from its page;
    the status of each answer."""
    import uvicorn

    with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx still works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    answers: dict[str, int] = {}

    def serve(self: uvicorn.Server, sockets: list[Any]) -> None:
        sockets[0].close()
        with TestClient(self.config.app, base_url="http://127.0.0.1:8765") as web:
            answers.update({path: web.get(path).status_code for path in PAGES})
            page = web.get(f"/jobs/{cancel}")
            token = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert token, page.text
            done = web.post(f"/jobs/{cancel}/cancel", data={"csrf": token[1]}, follow_redirects=False)
            answers["cancel"] = done.status_code

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    result = run("ui", "--port", "0")
    assert result.exit_code == 0, result.output
    return answers


@pytest.mark.parametrize("registry_cloud", ["aws", "gcp"], indirect=True)
def test_every_command_reaches_the_registry_and_the_cloud_through_the_sdk(
        registry_cloud: RegistryCloud, reg: Registry, watched: Calls, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, code, later = tmp_path / "job.yaml", tmp_path / "src", tmp_path / "later.yaml"
    spec.write_text(registry_cloud.spec("id: seen\n"))
    later.write_text(registry_cloud.spec("id: later\n"))
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
                    ["metrics", "seen", "--system"], ["cost", "--gpu-idle"],
                    ["cost", "--json", "--by", "owner"], ["sweep", "ls", "--all", "--json"],
                    ["cancel", "seen", "--force"], ["logs", "seen", "-f"], ["wait", "seen"]):
        result = run(*command)
        assert result.exit_code in (0, 3), (command, result.output)
    assert run("submit", str(later)).exit_code == 0  # stays QUEUED: the dashboard cancels it
    assert browse(monkeypatch, cancel="later") == {**dict.fromkeys(PAGES, 200), "cancel": 303}
    assert {job["state"] for job in json.loads(run("ls", "--all", "--json").stdout)} == {"CANCELLED"}
    from_cli = [what for what, ok in watched if not ok]
    assert from_cli == [], f"reached without the SDK: {sorted(set(from_cli))}"
    reached = {what for what, _ in watched}
    assert {"backend.connect", "Registry.job", "RootedStore.listing", "Registry.transition"} <= reached
    assert any(what.endswith(("Compute.list_managed", "Compute.terminate")) for what in reached), reached
    assert yaml.safe_load(reg.get_bytes("jobs/seen/job.json"))["state"] == "CANCELLED"
