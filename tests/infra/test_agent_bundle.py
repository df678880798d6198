"""The agent bundles the stack uploads to system/agent/: one per VM Python and architecture, each built for
its target (compiled modules and uv), listed with the right sha256, and the one this machine can run works
on its own in a clean interpreter: the agent imports, botocore can sign for S3, uv runs."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

import pytest

from jobplane.boot import agent_bundle, bundling
from jobplane.model import images
from tests.helpers import find_python, unwanted
from tests.infra.conftest import Synth

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels
ELF_MACHINE = {images.X86_64: 62, images.AARCH64: 183}  # e_machine in the ELF header

PROBE = r"""
import sys
sys.path[:0] = [sys.argv[1]]
import jobplane.agent.cli, jobplane.clouds.s3, jobplane.clouds.aws_imds
from uv import find_uv_bin
url = jobplane.clouds.s3.s3_client("eu-west-1").generate_presigned_url(
    "get_object", Params={"Bucket": "my-bucket", "Key": "k"}, ExpiresIn=60)
print(url.split("?")[0], find_uv_bin())
print(sorted({m.split(".")[0] for m in sys.modules} & {"google", "aws_lambda_powertools", "click", "rich"}))
"""


@pytest.fixture(scope="module")
def bundles(synth: Synth) -> tuple[Path, list[agent_bundle.Variant]]:
    (key,) = synth.deployments()["system/agent/"]["SourceObjectKeys"]
    asset = synth.asset_dir(key)
    return asset, agent_bundle.parse_manifest((asset / agent_bundle.MANIFEST).read_bytes())


def members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_every_python_of_the_images_and_both_architectures_with_matching_checksums(
        bundles: tuple[Path, list[agent_bundle.Variant]]) -> None:
    asset, variants = bundles
    assert sorted((v.python, v.arch) for v in variants) == sorted(
        (p, a) for p in images.python_versions() for a in images.ARCHITECTURES)
    assert {p.name for p in asset.iterdir()} == {v.name for v in variants} | {agent_bundle.MANIFEST}
    for v in variants:
        data = (asset / v.name).read_bytes()
        assert v.cloud == "aws" and v.size == len(data) and v.sha256 == hashlib.sha256(data).hexdigest()


def test_each_bundle_holds_its_targets_builds_and_only_what_the_agent_needs(
        bundles: tuple[Path, list[agent_bundle.Variant]]) -> None:
    asset, variants = bundles
    for v in variants:
        found = members(asset / v.name)
        tag = f"cpython-{v.python.replace('.', '')}-{v.arch}-linux-gnu"
        assert f"site/pydantic_core/_pydantic_core.{tag}.so" in found, v.name
        assert "site/jobplane/agent/core.py" in found and "site/boto3/__init__.py" in found
        assert not [n for n in found if n.startswith(("site/google/", "site/aws_lambda_powertools/", "site/rich/",
                                                      "site/optuna/", "site/numpy/"))]  # the functions' only
        assert unwanted(sorted(found), "aws", prefix="site/") == []  # no GCP adapter, local cloud, fake or CLI
        models = {n.split("/")[3] for n in found if n.startswith("site/botocore/data/") and n.count("/") > 3}
        assert models == set(bundling.BOTOCORE_SERVICES)
        assert not [n for n in found if "__pycache__" in n or n.endswith(".pyc")]
        uv = found["site/bin/uv"]
        assert uv.mode & 0o111
        with tarfile.open(asset / v.name) as tar:
            header = tar.extractfile(uv).read(20)  # type: ignore[union-attr]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == ELF_MACHINE[v.arch], v.name


@pytest.mark.parametrize("version", images.python_versions())
def test_the_bundles_this_machine_can_run_work_alone_in_a_clean_interpreter(
        bundles: tuple[Path, list[agent_bundle.Variant]], tmp_path: Path, version: str) -> None:
    """Each Python the images ship, where this machine has that interpreter: the agent runs on all of them."""
    asset, variants = bundles
    python = find_python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    (mine,) = [v for v in variants if v.python == version and v.arch == bundling.host_architecture()]
    with tarfile.open(asset / mine.name) as tar:
        tar.extractall(tmp_path, filter="data")
    site = tmp_path / "site"
    env = {"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    probe = subprocess.run([str(python), "-I", "-S", "-c", PROBE, str(site)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=120)
    assert probe.returncode == 0, probe.stderr
    url, uv = probe.stdout.splitlines()[0].split()
    assert url == "https://my-bucket.s3.eu-west-1.amazonaws.com/k" and uv == str(site / "bin" / "uv")
    assert probe.stdout.splitlines()[1] == "[]"  # nothing of the CLI, the Lambdas or GCP came along
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("uv ")
