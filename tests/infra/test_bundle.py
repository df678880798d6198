"""The Lambda bundle is complete: every handler imports from the synthesized asset directory alone.

The check runs in a clean interpreter (-I -S: no site-packages, no PYTHONPATH, no project on sys.path)
whose path is the asset directory plus a stand-in for what the Lambda runtime provides (boto3 and its
dependencies). The bundle's compiled modules (pydantic_core's, numpy's) are built for the target (arm64,
CPython 3.14), so each one this host cannot load is mapped to the host's build of the same version; a separate
assertion checks that the bundled ones are the target builds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.aws.bundle import LAMBDA_PYTHON, RUNTIME_PROVIDED
from tests.helpers import foreign_sdk_imports, unwanted
from tests.infra.conftest import ROOT, Synth

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels

HANDLERS = ("launcher", "sweeper", "rerun", "uptime_cap")
# What a run imports beyond what loading a handler does, checked as if a handler had loaded it: a bayesian
# sweep's proposals import optuna (and numpy) in the sweeper.
LATER_ROOTS = ("jobplane.decide.trials", "optuna")
RUNTIME_MODULES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")

PROBE = r"""
import ast, glob, importlib, importlib.abc, importlib.machinery, importlib.util, json, os, sys
asset, runtime, host_site = sys.argv[1:4]
handlers, extra = sys.argv[4].split(","), sys.argv[5].split(",")
sys.path[:0] = [asset, runtime]

# A compiled module the bundle holds built for the target loads as this host's build of the same version.
class HostBuilds(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        *parents, leaf = name.split(".")
        if not glob.glob(os.path.join(asset, *parents, glob.escape(leaf) + ".*-aarch64-linux-gnu.so")):
            return None
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if os.path.exists(host := os.path.join(host_site, *parents, leaf + suffix)):
                result["host_builds"][name] = host
                return importlib.util.spec_from_file_location(name, host)
        return None

result = {"handlers": {}, "modules": {}, "host_builds": {}}
sys.meta_path.insert(0, HostBuilds())
for name in handlers:
    try:
        module = importlib.import_module(f"functions.aws.{name}")
        result["handlers"][name] = "ok" if callable(getattr(module, "handler", None)) else "no handler()"
    except Exception as exc:
        result["handlers"][name] = f"{type(exc).__name__}: {exc}"
for name in extra:
    try:
        importlib.import_module(name)
        result["handlers"][name] = "ok"
    except Exception as exc:
        result["handlers"][name] = f"{type(exc).__name__}: {exc}"

# What a run imports later (function-level imports in the modules loaded so far, and in theirs): imported here too,
# so the checks below cover every module an invocation can load, not just the cold start's.
def later(path):
    tree = ast.parse(open(path).read())
    top = {id(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    # an `if TYPE_CHECKING:` block is read by type checkers only: no run imports it
    typing_only = {id(inner) for node in tree.body
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test) for inner in ast.walk(node)}
    # tried under `except ImportError`: a run that cannot import it goes on without (the agent's awscrt path)
    optional = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.Try)
                and any("ImportError" in ast.dump(h.type) for h in node.handlers if h.type is not None)
                for part in node.body for inner in ast.walk(part)}
    for node in ast.walk(tree):
        if id(node) in top or id(node) in typing_only or id(node) in optional or node is tree:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield from ((node.module, alias.name) for alias in node.names)

result["later"], seen = {}, set()
while todo := [m for n, m in list(sys.modules.items()) if n.split(".")[0] in ("jobplane", "functions")
               and getattr(m, "__file__", None) and m.__file__.startswith(asset) and n not in seen]:
    for module in todo:
        seen.add(module.__name__)
        for name, attr in later(module.__file__):
            try:
                found = importlib.import_module(name)
                if attr and hasattr(found, "__path__") and importlib.util.find_spec(f"{name}.{attr}"):
                    name = f"{name}.{attr}"  # from package import module
                    importlib.import_module(name)
                elif attr and not hasattr(found, attr):
                    raise ImportError(f"cannot import {attr} from {name}")
                result["later"][name] = "ok"
            except Exception as exc:
                result["later"][name] = f"{type(exc).__name__}: {exc}"
result["modules"] = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}
print(json.dumps(result))
"""


def lambda_asset_dir(synth: Synth) -> Path:
    (key,) = {fn["Properties"]["Code"]["S3Key"] for fn in synth.functions().values()}
    return synth.asset_dir(key)


def handler_names() -> list[str]:
    """The four contract handlers plus any other handler module in functions/aws."""
    extra = sorted(p.stem for p in (ROOT / "functions" / "aws").glob("*.py")
                   if "def handler(" in p.read_text() and p.stem not in HANDLERS)
    return [*HANDLERS, *extra]


@pytest.fixture(scope="module")
def runtime_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only what the Lambda Python runtime ships beyond the standard library, linked from this venv."""
    out = tmp_path_factory.mktemp("lambda-runtime")
    for name in RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec and spec.origin, name
        origin = Path(spec.origin)
        src = origin.parent if origin.name == "__init__.py" else origin
        (out / src.name).symlink_to(src)
    return out


@pytest.fixture(scope="module")
def probe(synth: Synth, runtime_standin: Path) -> dict[str, dict[str, str | None]]:
    host_core = importlib.util.find_spec("pydantic_core._pydantic_core")
    assert host_core and host_core.origin
    host_site = Path(host_core.origin).parents[1]  # where this host's builds of compiled modules are
    env = {"PATH": os.environ.get("PATH", ""), "JOBPLANE_BUCKET": "registry", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "POWERTOOLS_SERVICE_NAME": "jobplane", "POWERTOOLS_METRICS_NAMESPACE": "jobplane"}
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", PROBE, str(lambda_asset_dir(synth)), str(runtime_standin),
         str(host_site), ",".join(handler_names()), ",".join(LATER_ROOTS)],
        capture_output=True, text=True, env=env, cwd="/", timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, dict[str, str | None]] = json.loads(proc.stdout)
    return result


@pytest.mark.parametrize("name", handler_names())
def test_handler_imports_from_the_bundle_alone(probe: dict[str, dict[str, str | None]], name: str) -> None:
    assert (ROOT / "functions" / "aws" / f"{name}.py").exists(), f"functions/aws/{name}.py is missing"
    assert probe["handlers"][name] == "ok"


def test_what_a_run_imports_later_imports_from_the_bundle_too(probe: dict[str, dict[str, str | None]]) -> None:
    later = probe["later"]
    assert "jobplane.boot.bootstrap" in later and "jobplane.decide.launch" in later  # a launch's, imported when it runs
    assert {name: why for name, why in later.items() if why != "ok"} == {}


def test_every_imported_module_comes_from_the_bundle_runtime_or_stdlib(
        synth: Synth, runtime_standin: Path, probe: dict[str, dict[str, str | None]]) -> None:
    asset = str(lambda_asset_dir(synth))
    stdlib = os.path.dirname(os.__file__)
    assert {"pydantic_core._pydantic_core", "numpy._core._multiarray_umath"} <= set(probe["host_builds"])
    assert [probe["handlers"][name] for name in LATER_ROOTS] == ["ok"] * len(LATER_ROOTS)
    for name, origin in probe["modules"].items():
        if origin is None or origin.startswith(stdlib) or probe["host_builds"].get(name) == origin:
            continue
        top = name.split(".")[0]
        if top in RUNTIME_MODULES:
            assert origin.startswith(str(runtime_standin)), (name, origin)
        else:
            assert origin.startswith(asset), f"{name} imported from outside the bundle: {origin}"
    loaded = {n.split(".")[0] for n in probe["modules"]}
    assert {"jobplane", "functions", "pydantic", "yaml", "aws_lambda_powertools"} <= loaded
    assert not any(n == "google" or n.startswith("google.") for n in loaded), "an AWS handler imported google"


def test_bundle_holds_the_target_builds_and_no_runtime_gcp_code_local_cloud_or_fake(synth: Synth) -> None:
    asset = lambda_asset_dir(synth)
    tag = "cpython-" + LAMBDA_PYTHON.replace(".", "")
    assert list((asset / "pydantic_core").glob(f"_pydantic_core.{tag}-aarch64-linux-gnu.so"))
    assert list((asset / "numpy" / "_core").glob(f"_multiarray_umath.{tag}-aarch64-linux-gnu.so"))
    ours = sorted(p.relative_to(asset).as_posix() for p in asset.rglob("*")
                  if p.is_file() and p.relative_to(asset).parts[0] in ("jobplane", "functions"))
    assert "jobplane/clouds/aws.py" in ours and "jobplane/control/launcher.py" in ours
    assert unwanted(ours, "aws") == []
    assert not [n for n in ours if n.startswith("functions/") and not n.startswith("functions/aws/")
                and n != "functions/__init__.py"]
    assert foreign_sdk_imports({n: (asset / n).read_text() for n in ours if n.endswith(".py")}, "aws") == []
    for dist in RUNTIME_PROVIDED:
        assert not list(asset.glob(f"{dist}-*.dist-info")), f"{dist} is in the runtime; bundling it shadows it"
