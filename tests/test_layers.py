"""The package's folders in layers, written once here (docs/architecture.md's code map reads the same), and the
scan that keeps them: no import runs back up a layer, none goes sideways to a folder of the same layer, and no
circle joins two modules.

A folder is a package under jobplane/ (settings.py, the one top-level module, counts as one). A module may import
its own folder and the folders of lower layers. Every import counts, wherever it stands: at a module's top, inside a
function (a lazy import, which only defers the cost), under TYPE_CHECKING, and `importlib.import_module("...")`
with a literal name. The one exception is the package's own __init__.py, which hands out jobplane.Client by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import jobplane
from tests.helpers import imported

# Bottom up. Each layer may use those above it in this list, never those below it nor a folder beside it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("settings", "model"),  # the deployment's settings (read by the entry points); the job's model: plain values
    ("clouds",),  # one adapter per cloud behind small protocols (ObjectStore, Compute, Metadata)
    ("store", "views", "boot"),  # the registry's objects and job records; read views; what a VM boots
    ("decide",),  # the pure decisions
    ("vending", "agent", "ops"),  # credential vending; the agent on a VM; the job operations the SDK offers
    ("deployment",),  # what a function invocation works with: Deployment, Context, notify, telemetry
    ("sweeps",),  # hyperparameter sweeps: record, store, curves, the sweep reconcile, the SDK's operations
    ("control",),  # the launcher and the reconcilers
    ("sdk",),  # jobplane.Client
    ("ui",),  # the dashboard, on an SDK Client
    ("local",),  # the local cloud behind `jobplane local up` and `make demo`: the product over emulators
    ("cli",),  # the `jobplane` command, `jobplane local` included
)
PACKAGE = Path(jobplane.__file__).resolve().parent
EXEMPT = {"jobplane"}  # __init__.py: `from jobplane import Client` imports jobplane.sdk by name, on first use


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, source: str, known: Iterable[str], package: bool = False) -> set[str]:
    """The jobplane modules the source of module `name` imports (package: the source is a package's __init__.py),
    wherever the import stands; a name imported from a module counts as that module."""
    known = set(known)
    found = imported(source, name if package else name.rpartition(".")[0], known.__contains__)
    return {_owner(m, known) for m in found if m.split(".")[0] == "jobplane"} - {name, ""}


def _owner(module: str, known: set[str]) -> str:
    """The module an imported name lives in: jobplane.model.keys.JOBS -> jobplane.model.keys."""
    while module not in known and "." in module:
        module = module.rsplit(".", 1)[0]
    return module if module in known else ""


def folder(module: str) -> str:
    """jobplane.model.keys -> model; jobplane.settings -> settings."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def graph(found: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imports(name, path.read_text(), found, path.name == "__init__.py") for name, path in found.items()}


def upward(edges: Mapping[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Each import from a folder to one of the same or a higher layer, as 'module -> module' (a folder with no layer
    counts as above every other: give it one)."""
    level = {f: i for i, layer in enumerate(layers) for f in layer}
    return sorted(f"{a} -> {b}" for a, targets in edges.items() if a not in EXEMPT for b in targets
                  if folder(a) != folder(b) and level.get(folder(b), len(layers)) >= level.get(folder(a), -1))


def circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_folder_of_the_package_has_its_layer_once() -> None:
    placed = [f for layer in LAYERS for f in layer]
    assert len(placed) == len(set(placed))
    folders = {folder(m) for m in modules() if m not in EXEMPT}
    assert sorted(folders - set(placed)) == [], "give each new folder its layer in LAYERS (and the code map)"
    assert sorted(set(placed) - folders) == [], "these layers name no folder of the package"


def test_the_code_map_names_every_folder_in_layer_order() -> None:
    """docs/architecture.md's code map lists the package folder for folder, bottom up as LAYERS has them."""
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    block = text.split("## Code map", 1)[1].split("```")[1]
    named = [m.group(1) for m in re.finditer(r"^  (\w+)(?:/|\.py) ", block, re.M)]
    assert named == [f for layer in LAYERS for f in layer]


def test_no_import_runs_up_a_layer_or_sideways() -> None:
    assert upward(graph(modules())) == [], \
        "move what both need down a layer, or pass it in as an argument: a folder uses only the layers below it"


def test_no_two_modules_import_each_other_round_a_circle() -> None:
    assert circles(graph(modules())) == []


def test_the_scan_sees_every_way_of_importing() -> None:
    known = {"jobplane.model", "jobplane.model.keys", "jobplane.store", "jobplane.store.registry", "jobplane.sdk",
             "jobplane.settings", "jobplane.clouds.base", "jobplane.clouds", "jobplane.decide", "jobplane.decide.rules"}
    source = ("from jobplane.model import keys\nimport jobplane.settings\nfrom jobplane.clouds.base import Instance\n"
              "from . import registry\nif TYPE_CHECKING:\n    from jobplane.decide.rules import Rule\n"
              "def f():\n    from jobplane.store.registry import Registry\n"
              "    importlib.import_module('jobplane.sdk')\nimport json\nfrom os import path\n")
    assert imports("jobplane.store.rooted", source, known) == {
        "jobplane.model.keys", "jobplane.settings", "jobplane.clouds.base", "jobplane.store.registry",
        "jobplane.decide.rules", "jobplane.sdk"}


def test_an_upward_import_a_sideways_one_and_a_circle_are_caught() -> None:
    layers = (("model",), ("store", "views"), ("control",))
    edges = {"jobplane.model.keys": {"jobplane.store.registry"},  # up
             "jobplane.store.registry": {"jobplane.model.keys", "jobplane.views.cost"},  # down, sideways
             "jobplane.views.cost": set(), "jobplane.control.launcher": {"jobplane.store.registry"},
             "jobplane.control.reconcile": {"jobplane.control.launcher"},
             "jobplane.control.launcher2": {"jobplane.control.reconcile2"},
             "jobplane.control.reconcile2": {"jobplane.control.launcher2"}}
    assert upward(edges, layers) == ["jobplane.model.keys -> jobplane.store.registry",
                                     "jobplane.store.registry -> jobplane.views.cost"]
    assert circles(edges) == [["jobplane.model.keys", "jobplane.store.registry"],
                              ["jobplane.control.launcher2", "jobplane.control.reconcile2"]]
