"""What `jobplane` loads before it knows the command: every test and user pays it on each run. `--help` and
`--version` need click, the commands' options and rich; a command loads the models, the SDK and a cloud's
library when it runs (checked by loaded modules in a fresh interpreter, not by a clock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the job models, the SDK and its backends, both clouds' libraries (pydantic itself comes with the cost views'
# billing rule, jobplane.model.usage: two small models)
HEAVY = ("jobplane.sdk", "jobplane.ops", "jobplane.model.spec", "jobplane.model.jobrecord",
         "jobplane.model.policy", "jobplane.model.metrics", "boto3", "botocore", "google.cloud.storage",
         "google.cloud.compute", "google.api_core", "google.auth")  # (the google namespaces come with site)
PROBE = r"""
import json, sys
from click.testing import CliRunner
from jobplane.cli import cli
result = CliRunner().invoke(cli, {args!r})
print(json.dumps({{"code": result.exit_code, "output": result.output, "loaded": sorted(sys.modules)}}))
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["submit", "--help"], ["cost", "--help"]])
def test_help_and_version_load_no_model_sdk_or_cloud_library(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "shared")})
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.splitlines()[-1])
    assert probe["code"] == 0 and probe["output"], probe["output"]
    assert [m for m in probe["loaded"] if any(m == h or m.startswith(h + ".") for h in HEAVY)] == []
