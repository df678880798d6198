"""The GCP agent bundle this machine's VMs boot from (what the local GCP cloud publishes, built from the
installed distributions): no AWS adapter, local cloud, fake or CLI in it, and the agent imports from it alone
in a clean interpreter, with google-cloud-storage and without boto3."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jobplane.boot import bundling
from jobplane.local import cache_dir
from tests.helpers import foreign_sdk_imports, unwanted

pytestmark = pytest.mark.timeout(300)

PROBE = r"""
import os, sys
sys.path[:0] = [sys.argv[1]]
os.environ["STORAGE_EMULATOR_HOST"] = "http://127.0.0.1:9"  # never called: the client is only built
import jobplane.agent.cli, jobplane.clouds.gce_metadata
from jobplane.clouds.gcs import GcsStore
print(GcsStore("registry").vm_request("jobs/j/code/code.tar.gz", write=False, expires=60)[1])
print(sorted({m.split(".")[0] for m in sys.modules} & {"boto3", "botocore", "aws_lambda_powertools", "click", "rich"}))
"""


def test_the_gcp_agent_bundle_ships_no_aws_adapter_or_fake_and_runs_alone(tmp_path: Path) -> None:
    path, variant = bundling.local_variant("gcp", cache_dir())
    assert variant.cloud == "gcp"
    with tarfile.open(path) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    site = tmp_path / "site"
    assert "site/jobplane/clouds/gcs.py" in names and "site/google/cloud/storage/__init__.py" in names
    assert unwanted(names, "gcp", prefix="site/") == []
    assert not [n for n in names if n.startswith(("site/boto3/", "site/botocore/"))]
    ours = {str(p.relative_to(site)): p.read_text() for p in (site / "jobplane").rglob("*.py")}
    assert foreign_sdk_imports(ours, "gcp") == []
    probe = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, str(site)], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=120)
    assert probe.returncode == 0, probe.stderr
    url, loaded = probe.stdout.splitlines()
    assert url == "http://127.0.0.1:9/storage/v1/b/registry/o/jobs%2Fj%2Fcode%2Fcode.tar.gz?alt=media"
    assert loaded == "[]"  # nothing of AWS, the Lambdas or the CLI came along
