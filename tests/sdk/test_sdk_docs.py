"""docs/sdk.md stays true to jobplane.sdk. Its reference is rendered from the docstrings by mkdocstrings when the
site is built (`make docs`, strict), so it cannot go stale; these check what the build cannot: that it names
everything the SDK exports, that everything it renders has a docstring, and that the examples' Python parses and
calls only what exists, with keywords the calls take."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobplane import sdk
from jobplane.agent.layout import hyperparameter_env
from jobplane.model.spec import parse_spec

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "sdk.md"
# Exported for type hints and what the SDK's values hold; the page says where they are met, not a section each.
NOT_IN_THE_REFERENCE = {"State", "JobView", "Status", "Sample", "FieldError", "Submission", "UploadProgress"}
# What the examples call things, and what those are.
NAMES: dict[str, Any] = {"client": sdk.Client, "job": sdk.Job, "loss": sdk.Metric, "sdk": sdk, "found": sdk.Sweep,
                         "watch": sdk.Watch, "out": sdk.Output("", 0, 0),
                         "exc": sdk.InvalidSpec([sdk.FieldError("run", "required")]),
                         "error": sdk.FieldError("run", "required")}


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def rendered() -> list[str]:
    return re.findall(r"^::: jobplane\.sdk\.(\w+)$", PAGE.read_text(), flags=re.M)


def test_the_reference_names_everything_the_sdk_exports() -> None:
    assert set(sdk.__all__) - set(rendered()) == NOT_IN_THE_REFERENCE
    assert all(hasattr(sdk, name) for name in rendered())


@pytest.mark.parametrize("name", ["Client", "Job", "Metric", "LogLine", "JobplaneError", "Sweep", "Watch"])
def test_every_public_member_has_a_docstring(name: str) -> None:
    cls = getattr(sdk, name)
    missing = [member for member, value in vars(cls).items() if not member.startswith("_")
               and (inspect.isfunction(value) or isinstance(value, property | classmethod))
               and not inspect.getdoc(value.fget if isinstance(value, property) else value)]
    assert missing == [] and inspect.getdoc(cls)


def test_the_examples_parse_and_call_what_exists() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 6
    wrong = []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in NAMES:
                owner = NAMES[node.value.id]
                if not hasattr(owner, node.attr):
                    wrong.append(f"{node.value.id}.{node.attr}")
            if isinstance(node, ast.Call):
                target = _called(node.func)
                if target is not None and node.keywords:
                    params = inspect.signature(target).parameters
                    wrong += [f"{ast.unparse(node.func)}({k.arg}=)" for k in node.keywords
                              if k.arg not in params]
    assert wrong == []


def _called(func: ast.expr) -> Any:
    if isinstance(func, ast.Name) and func.id == "Client":
        return sdk.Client
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in NAMES:
        return getattr(NAMES[func.value.id], func.attr, None)
    return None


def test_the_learning_rates_the_examples_pass_the_demo_job_change_its_result(tmp_path: Path) -> None:
    """The notebook's and the "many jobs at once" learning rates, each run as the demo job's agent runs it (its
    spec's run command, in examples/train, the hyperparameters in the environment as the agent sets them), end at
    different losses: the script trains with them (it once read only --lr and LEARNING_RATE, so all ended alike)."""
    pytest.importorskip("numpy", reason="the demo's script needs numpy")
    rates: list[float] = []
    for block in python_blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.keyword) and node.arg == "hyperparameters" and isinstance(node.value, ast.Dict):
                rates += [v.value for k, v in zip(node.value.keys, node.value.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == "lr" and isinstance(v, ast.Constant)]
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "rates":
                rates += ast.literal_eval(node.value)
    assert len(rates) >= 5, rates  # the notebook's one, the pool's four
    demo = parse_spec((REPO / "examples" / "demo.yaml").read_text())
    losses, said = {}, {}
    for lr in sorted(set(rates)):
        out = tmp_path / str(lr)
        env = {**os.environ, **hyperparameter_env(demo.model_copy(update={"hyperparameters": {"lr": lr}})),
               "JOBPLANE_CHECKPOINT_DIR": str(out / "checkpoints"), "JOBPLANE_ARTIFACTS_DIR": str(out / "model")}
        command = [sys.executable, *shlex.split(demo.run)[1:], "--sleep", "0"]  # the steps without their pause
        done = subprocess.run(command, cwd=REPO / "examples" / "train", env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        losses[lr] = json.loads((out / "model" / "result.json").read_text())["loss"]
        said[lr] = done.stdout
    assert len(set(losses.values())) == len(losses), losses
    assert all(f"learning rate {lr:g}\n" in text for lr, text in said.items())
