"""Build the Lambda code asset and the agent bundles at synth time, without Docker.

Lambda asset (one directory shared by the four functions, so CDK uploads it once):
    functions/aws/*.py + shared/jobplane as shipped on AWS (jobplane.boot.bundling.shipped: no GCP adapter, no CLI,
    no local cloud or fake)
    + the dependencies the python3.14 runtime lacks, as arm64 wheels from PyPI.
The runtime ships boto3/botocore and their dependencies; everything else is bundled, Powertools included
(no public layer: the bundle is then the whole truth, and the bundled-import test can prove it complete).
pydantic v2 has a compiled core (and optuna needs numpy), so dependencies are fetched with `pip download
--platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --only-binary=:all:` pinned to the versions
installed here (what the tests ran).

Agent bundles (uploaded to system/agent/ at deploy time): one per VM Python and architecture, which the
bootstrap fetches with python3 alone (jobplane.boot.agent_bundle, jobplane.boot.bundling).

Both are cached outside the checkout (jobplane.local.cache_dir()/cdk-assets, beside the local cloud's wheels
and image) by a hash of their inputs, so every clone on a machine shares them: only the first synth on a fresh
machine needs PyPI, and builds them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from jobplane.boot import bundling
from jobplane.boot.bundling import atomic_build, digest
from jobplane.local import cache_dir

ROOT = Path(__file__).resolve().parents[2]
CACHE = cache_dir() / "cdk-assets"

LAMBDA_PYTHON = "3.14"
# The python3.14 runtime is Amazon Linux 2023 (glibc 2.34): older wheels say manylinux2014, numpy's say 2_28.
LAMBDA_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64")

# Shipped by the Lambda Python runtime (boto3 and its dependency closure): never bundled.
RUNTIME_PROVIDED = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "python_dateutil", "six", "urllib3"})
# What the handlers import beyond the standard library and the runtime.
LAMBDA_REQUIREMENTS = ("pydantic", "pydantic_core", "PyYAML", "aws-lambda-powertools",
                       "optuna")  # a bayesian sweep's proposals (decide.trials)


def _pinned(requirement: str) -> str:
    """Pin a requirement to the version installed in this environment (the one the tests exercised)."""
    name, _, extra = requirement.partition("[")
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return requirement
    return f"{name}{'[' + extra if extra else ''}=={version}"


def _pip_download(dest: Path, requirements: Sequence[str], platforms: Sequence[str], python: str) -> None:
    # Platforms of one architecture only: given several, pip takes the first wheel matching any of them. The
    # dependencies' versions are the ones installed here too (the constraints), as the requirements' are.
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(bundling.pins(requirements)) + "\n")
        constraints.flush()
        cmd = [sys.executable, "-m", "pip", "download", "-qq", "--disable-pip-version-check", "--dest", str(dest),
               "--only-binary=:all:", "--implementation", "cp", "--python-version", python, "--constraint",
               constraints.name, *(f"--platform={platform}" for platform in platforms)]
        subprocess.run([*cmd, *requirements], check=True, stdout=subprocess.DEVNULL)


def _dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("-", "_").replace(".", "_")


def lambda_dependencies() -> Path:
    """Unpacked arm64/python3.14 site directory with every bundled third-party package."""
    requirements = [_pinned(r) for r in LAMBDA_REQUIREMENTS]
    key = digest([*LAMBDA_PLATFORMS, LAMBDA_PYTHON, *requirements, *sorted(RUNTIME_PROVIDED),
                  *bundling.pins(requirements)])

    def build(tmp: Path) -> None:
        wheels = tmp / "wheels"
        _pip_download(wheels, requirements, LAMBDA_PLATFORMS, LAMBDA_PYTHON)
        site = tmp / "site"
        for wheel in sorted(wheels.glob("*.whl")):
            if _dist_name(wheel) not in RUNTIME_PROVIDED:
                with zipfile.ZipFile(wheel) as zf:
                    zf.extractall(site)

    return atomic_build(CACHE / f"lambda-deps-{key}", build) / "site"


def lambda_asset() -> Path:
    """The directory every jobplane Lambda is deployed from (handler = functions.aws.<name>.handler)."""
    deps = lambda_dependencies()
    # functions/aws and what jobplane ships on AWS: no GCP adapter (an AWS handler never imports google), no
    # CLI, no local cloud or fake (jobplane.boot.bundling.shipped)
    handlers = [ROOT / "functions" / "__init__.py", *bundling.source_files(ROOT / "functions" / "aws")]
    sources = [*handlers, *bundling.package_files("aws")]
    key = digest([str(deps), *(f"{p.relative_to(ROOT)}\n{p.read_text()}" for p in sources)])

    def build(tmp: Path) -> None:
        shutil.copytree(deps, tmp, dirs_exist_ok=True)
        for path in sources:
            rel = path.relative_to(ROOT)
            dest = tmp / (rel.relative_to("shared") if rel.parts[0] == "shared" else rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)

    return atomic_build(CACHE / f"lambda-{key}", build)


def agent_bundles(pythons: Sequence[str]) -> Path:
    """system/agent/: the agent bundle for every VM Python (these plus the image aliases') and architecture,
    and their manifest (jobplane.boot.bundling; built from PyPI wheels once per set of inputs)."""
    key = digest(["aws", *pythons, *bundling.pins(bundling.REQUIREMENTS["aws"]),
                  *(f"{p.relative_to(bundling.PACKAGE)}\n".encode() + p.read_bytes()
                    for p in bundling.package_files("aws"))])

    def build(tmp: Path) -> None:
        bundling.build_all(tmp, "aws", pythons, deps_cache=CACHE)

    return atomic_build(CACHE / f"agent-{key}", build)


def main() -> None:
    """`python -m infra.aws.bundle`: build what a synth of the default stack needs into the cache (the wheels
    from PyPI, the Lambda asset, the agent bundles), so the first synth after it only packs."""
    from infra.aws.config import ControlPlaneConfig

    print(f"Lambda asset at {lambda_asset()}")
    print(f"agent bundles at {agent_bundles(ControlPlaneConfig().vm_pythons)}")


if __name__ == "__main__":
    main()
