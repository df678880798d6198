"""No code outside store/rooted.py reaches through a registry (a RootedStore, or the job Registry built on one) to
its ObjectStore: callers use its methods, which apply the root prefix and name what they do. An AST scan of shared/
and functions/ keeps it true."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY_NAMES = {"reg", "registry"}  # what the code calls one: reg, self.reg, env.registry, ...


def _is_registry(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in REGISTRY_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in REGISTRY_NAMES)


def _uses_store(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "store" and _is_registry(node.value)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and _is_registry(node.args[0])
            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "store")


def reaches_through(source: str) -> list[int]:
    """Lines that use `<registry>.store` or getattr(<registry>, "store")."""
    nodes = ast.walk(ast.parse(source))
    return sorted(node.lineno for node in nodes if isinstance(node, ast.expr) and _uses_store(node))


def sources() -> list[Path]:
    files = [*ROOT.glob("shared/jobplane/**/*.py"), *ROOT.glob("functions/**/*.py")]
    return [f for f in files if f != ROOT / "shared/jobplane/store/rooted.py"]


def test_the_scan_sees_every_way_of_reaching_through() -> None:
    source = ("reg.store.get(k)\nself.reg.store.put(k, b'')\nx = env.registry.store\n"
              "getattr(reg, 'store', None)\nself.store.get(k)\nreg.put(k, b'')\n")
    assert reaches_through(source) == [1, 2, 3, 4]


def test_the_scan_covers_the_package_and_the_functions() -> None:
    names = {f.relative_to(ROOT).as_posix() for f in sources()}
    assert {"shared/jobplane/control/launcher.py", "shared/jobplane/agent/core.py",
            "functions/aws/metering.py"} <= names


def test_no_caller_outside_the_registry_touches_its_store() -> None:
    found = {f.relative_to(ROOT).as_posix(): lines for f in sources() if (lines := reaches_through(f.read_text()))}
    assert not found, f"these lines use the registry's store (add a RootedStore or Registry method instead): {found}"
