"""`jobplane validate` and `jobplane schema`, as processes: exit status, stdout and stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.specs import BAD_SPECS
from tests.warm import Warm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
JOBPLANE = [sys.executable, "-m", "jobplane.cli"]


@pytest.fixture
def run(warm: Warm) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`jobplane ARGS` as a process (forked warm: tests/warm.py)."""
    def jobplane(*args: str) -> subprocess.CompletedProcess[str]:
        return warm.run([*JOBPLANE, *args], capture_output=True, text=True, timeout=60)
    return jobplane


def test_examples_are_valid(run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    assert len(EXAMPLES) >= 3
    result = run("validate", *map(str, EXAMPLES))
    assert result.returncode == 0, result.stderr


THROUGH_THE_CLI = {"num_nodse", "max_runtime", "num_nodes", "id", "cloud", "code", "run"}  # one subprocess each


@pytest.mark.parametrize(("doc", "field"), [(doc, expected.split(":")[0]) for doc, expected in BAD_SPECS
                                            if expected.split(":")[0] in THROUGH_THE_CLI])
def test_each_bad_spec_exits_1_naming_the_field(tmp_path: Path, doc: str, field: str,
                                                run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(doc)
    result = run("validate", str(bad), str(EXAMPLES[0]))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines, result.stderr
    assert all(line.startswith(f"{bad}: ") for line in lines)
    assert any(line.startswith(f"{bad}: {field}: ") for line in lines), lines


def test_policy_checks(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("allowed_instance_types: ['t3.*']\nmax_nodes_per_job: 1\n")
    result = run("validate", "--policy", str(policy), *map(str, EXAMPLES))
    assert result.returncode == 1
    assert f"{ROOT / 'examples' / 'two-node.yaml'}: num_nodes: 2 exceeds the policy's maximum" in result.stderr
    assert "instance_type: 'g5.12xlarge' is not allowed by the platform policy (allowed: t3.*)" in result.stderr
    assert "single-node.yaml: instance_type" not in result.stderr


def test_bad_policy_file_names_the_field(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_nodes_per_job: lots\n")
    result = run("validate", "--policy", str(policy), str(EXAMPLES[0]))
    assert result.returncode == 1 and f"{policy}: max_nodes_per_job: " in result.stderr


def test_missing_file_is_one_line(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "(file): cannot read" in result.stderr and "Traceback" not in result.stderr


def test_schema_matches_committed_file(run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run("schema")
    assert result.returncode == 0
    committed = (ROOT / "schema" / "jobspec.schema.json").read_text()
    assert result.stdout == committed, "run `jobplane schema > schema/jobspec.schema.json`"
    schema = json.loads(committed)
    assert "run" in schema["required"] and schema["additionalProperties"] is False
