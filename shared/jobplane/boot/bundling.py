"""Build agent bundles (layout in jobplane.boot.agent_bundle).

Two sources, one layout: at deploy time every (Python, architecture) variant comes from PyPI wheels
(`pip install --target --platform --python-version --only-binary=:all:`, each package pinned to the version
installed here, the one the tests ran); the local cloud builds the variant of this machine from the
distributions installed here, so it needs no network. Either way the jobplane package is copied from this
very installation, and botocore keeps only the service models the agent uses.

`python -m jobplane.boot.bundling --cloud gcp --out build/agent` builds every variant and the manifest
(`make gcp-package`); the CDK stack calls build_all itself.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from jobplane.boot import agent_bundle
from jobplane.boot.agent_bundle import SITE, Variant
from jobplane.model import images

if TYPE_CHECKING:
    from packaging.requirements import Requirement

# What the agent imports on each cloud beyond the standard library, plus uv for requirements.txt. awscrt: the
# compiled S3 path for files of one part (jobplane.clouds.s3_crt); a VM whose bundle lacks it uses botocore.
REQUIREMENTS = {"aws": ("pydantic", "PyYAML", "boto3", "awscrt", "uv"),
                "gcp": ("pydantic", "PyYAML", "google-cloud-storage", "uv")}
PLATFORMS = {images.X86_64: "manylinux2014_x86_64", images.AARCH64: "manylinux2014_aarch64"}
# The agent talks to S3, and to SSM for a job's secrets (176 KB); STS and SSO serve botocore's credential chain.
# The other ~400 models (28 MB, 2,900 files) would only slow every boot's unpacking.
BOTOCORE_SERVICES = frozenset({"s3", "ssm", "sts", "sso", "sso-oidc"})
KEEP_SCRIPTS = frozenset({"uv"})  # site/bin/: other packages' console scripts are of no use to the agent
PACKAGE = Path(__file__).resolve().parents[1]  # the jobplane package every bundle carries
MTIME = 1_577_836_800  # 2020-01-01: fixed, so the same inputs give the same bytes (and sha256)


# ---- shared helpers (also used by the CDK asset builder) -----------------------------------------------
def digest(parts: Iterable[str | bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def atomic_build(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a private temp dir and rename it into place, so an interrupted or concurrent build never
    leaves a half-built cache entry (the loser of a race discards its copy)."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(tmp)
        tmp.rename(target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def source_files(base: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


# What no deployment ships (agent bundles, the Lambda asset, the Cloud Functions source): the CLI, the SDK, the
# dashboard and what builds their backends, the local cloud with its fakes and its moto helpers, this builder, the
# in-memory store of tests.
NEVER_SHIPPED = ("cli/", "sdk/", "ui/", "ops/backend.py", "boot/bundling.py", "local/", "clouds/aws_local.py",
                 "clouds/memory.py")
# Each cloud's adapters: what is shipped for one cloud never carries the other's.
ADAPTERS = {"aws": ("clouds/aws.py", "clouds/aws_ecr.py", "clouds/aws_imds.py", "clouds/aws_vend.py", "clouds/s3.py",
                    "clouds/sns.py", "clouds/aws_secrets.py", "vending/aws_iam.py", "vending/aws.py"),
            "gcp": ("clouds/gcp.py", "clouds/gce_metadata.py", "clouds/gcs.py", "clouds/pubsub.py",
                    "clouds/gce_identity.py", "clouds/gcp_vend.py", "clouds/gcs_downscope.py", "clouds/gcp_secrets.py",
                    "vending/gcp.py")}


def shipped(rel: str, cloud: str) -> bool:
    """Whether the package file at rel (e.g. "clouds/gcs.py") goes into what is deployed on cloud."""
    foreign = [m for other, modules in ADAPTERS.items() if other != cloud for m in modules]
    return not rel.startswith(NEVER_SHIPPED) and rel not in foreign


def package_files(cloud: str) -> list[Path]:
    """The jobplane files a deployment on cloud runs, its functions and its VMs alike."""
    return [p for p in source_files() if shipped(p.relative_to(PACKAGE).as_posix(), cloud)]


def pins(requirements: Sequence[str] | None = None) -> list[str]:
    """name==version of every distribution installed here (jobplane aside), or of those the requirements may pull
    in: pip's constraints, and part of the keys of what is built from them, so a tool installed beside them (a
    profiler, a linter) changes neither."""
    found = {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}
    wanted = None if requirements is None else _reachable(requirements)
    return sorted(f"{name}=={version}" for name, version in found.items() if name.lower() != "jobplane"
                  and (wanted is None or _canonical(name) in wanted))


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def _reachable(requirements: Sequence[str]) -> set[str]:
    """The distributions installed here that the requirements may pull in on any platform: a dependency behind a
    marker is followed whatever the Python or platform, and behind an extra only when that extra is asked for."""
    def follows(dep: Requirement, req: Requirement) -> bool:
        return dep.marker is None or "extra" not in str(dep.marker) or any(
            dep.marker.evaluate({"extra": e}) for e in (*req.extras, ""))

    return set(_walk(requirements, follows, missing_ok=True))


def _walk(requirements: Sequence[str], follows: Callable[[Requirement, Requirement], bool], *,
          missing_ok: bool) -> dict[str, metadata.Distribution]:
    """The installed distributions the requirements lead to (by canonical name), following each dependency `follows`
    accepts (the dependency, the requirement that brought it); one not installed is skipped if missing_ok, else
    PackageNotFoundError."""
    from packaging.requirements import Requirement

    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        if name in found:
            continue
        try:
            dist = found[name] = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:  # not installed here: pip is free to choose it
            if missing_ok:
                continue
            raise
        todo += [dep for dep in map(Requirement, dist.requires or []) if follows(dep, req)]
    return found


def host_architecture() -> str:
    machine = platform.machine().lower()
    return images.AARCH64 if machine in ("aarch64", "arm64") else images.X86_64


# ---- one variant -----------------------------------------------------------------------------------------
def _copy_package(site: Path, cloud: str) -> None:
    for path in package_files(cloud):
        dest = site / "jobplane" / path.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


def kept(rel: PurePosixPath) -> bool:
    """Whether a file at this path under site/ belongs in a bundle."""
    parts = rel.parts
    if "__pycache__" in parts or rel.suffix == ".pyc":
        return False
    if parts[:2] == ("botocore", "data") and len(parts) > 3:
        return parts[2] in BOTOCORE_SERVICES
    return parts[0] != "bin" or rel.name in KEEP_SCRIPTS


def prune(site: Path) -> None:
    for path in sorted(site.rglob("*"), reverse=True):  # children before their directories
        if path.is_file() and not kept(PurePosixPath(path.relative_to(site).as_posix())):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def pack(site: Path, dest: Path, cloud: str, python: str, arch: str) -> Variant:
    """A deterministic tar.gz of site/ (sorted entries, fixed times and owners) and its manifest entry."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=1) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(site.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=f"{SITE}/{path.relative_to(site).as_posix()}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
            info.mode = 0o755 if path.is_dir() or info.mode & 0o111 else 0o644
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    data = dest.read_bytes()
    return Variant(cloud, python, arch, hashlib.sha256(data).hexdigest(), len(data))


def build_from_index(out: Path, cloud: str, python: str, arch: str, constraints: Path,
                     deps_cache: Path | None = None) -> Variant:
    """One variant from PyPI wheels for the target Python and architecture (any host can build any). With
    deps_cache, the wheels' unpacked site is kept there by its inputs, so a change to jobplane alone only packs."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / SITE
        if deps_cache is None:
            _install(site, cloud, python, arch, constraints)
        else:
            key = digest([cloud, python, arch, constraints.read_text(), *REQUIREMENTS[cloud]])
            deps = atomic_build(deps_cache / f"agent-deps-{cloud}-{python}-{arch}-{key}",
                                lambda d: _install(d / SITE, cloud, python, arch, constraints))
            shutil.copytree(deps / SITE, site, symlinks=True)
        _copy_package(site, cloud)
        prune(site)
        return pack(site, out / agent_bundle.file_name(cloud, python, arch), cloud, python, arch)


def _install(site: Path, cloud: str, python: str, arch: str, constraints: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-qq", "--disable-pip-version-check", "--no-compile",
         "--target", str(site), "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
         "--platform", PLATFORMS[arch], "--constraint", str(constraints), *REQUIREMENTS[cloud]],
        check=True, stdout=subprocess.DEVNULL)


def build_all(out: Path, cloud: str, pythons: Sequence[str] = (), archs: Sequence[str] = images.ARCHITECTURES,
              deps_cache: Path | None = None) -> Path:
    """Every variant for these Pythons (plus those of the image aliases) and architectures, and the manifest."""
    versions = sorted({*images.python_versions(), *pythons}, key=lambda v: tuple(map(int, v.split("."))))
    out.mkdir(parents=True, exist_ok=True)
    constraints = out / "constraints.txt"
    constraints.write_text("\n".join(pins(REQUIREMENTS[cloud])) + "\n")
    try:
        variants = [build_from_index(out, cloud, python, arch, constraints, deps_cache)
                    for python in versions for arch in archs]
    finally:
        constraints.unlink()
    (out / agent_bundle.MANIFEST).write_bytes(agent_bundle.manifest(variants))
    return out


# ---- the variant of this machine, from what is installed here ---------------------------------------------
def _closure(requirements: Sequence[str]) -> list[metadata.Distribution]:
    """What the requirements install on this machine (markers evaluated here), each of it installed here."""
    def follows(dep: Requirement, req: Requirement) -> bool:
        return dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (*req.extras, ""))

    found = _walk(requirements, follows, missing_ok=False)
    return [found[n] for n in sorted(found)]


def build_from_installed(out: Path, cloud: str) -> Variant:
    """This machine's variant (its Python and architecture) from the installed distributions."""
    python, arch = f"{sys.version_info[0]}.{sys.version_info[1]}", host_architecture()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / SITE
        for dist in _closure(REQUIREMENTS[cloud]):
            for file in dist.files or []:
                rel = PurePosixPath(file.as_posix())
                if rel.parts[0] == "..":  # a console script, installed outside site-packages
                    rel = PurePosixPath("bin", rel.name)
                src = Path(str(dist.locate_file(file)))
                if kept(rel) and src.is_file():
                    dest = site.joinpath(*rel.parts)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest)
        _copy_package(site, cloud)
        return pack(site, out / agent_bundle.file_name(cloud, python, arch), cloud, python, arch)


def local_variant(cloud: str, cache: Path) -> tuple[Path, Variant]:
    """This machine's bundle (path, manifest entry), built once per set of inputs and kept under cache (the
    local cloud's, jobplane.local.cache_dir)."""
    versions = [f"{d.metadata['Name']}=={d.version}" for d in _closure(REQUIREMENTS[cloud])]
    key = digest([cloud, sys.version, host_architecture(), *versions, *sorted(BOTOCORE_SERVICES),
                  *(f"{p.relative_to(PACKAGE)}\n".encode() + p.read_bytes() for p in package_files(cloud))])
    out = atomic_build(cache / "bundles" / key, lambda tmp: _write_single(tmp, cloud))
    (variant,) = agent_bundle.parse_manifest((out / agent_bundle.MANIFEST).read_bytes())
    return out / variant.name, variant


def _write_single(out: Path, cloud: str) -> None:
    (out / agent_bundle.MANIFEST).write_bytes(agent_bundle.manifest([build_from_installed(out, cloud)]))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jobplane.boot.bundling", description=__doc__.splitlines()[0])
    p.add_argument("--cloud", choices=sorted(REQUIREMENTS), required=True)
    p.add_argument("--out", type=Path, required=True, help="directory for the bundles and manifest.json")
    p.add_argument("--python", action="append", default=[], help="another VM Python version (repeatable)")
    args = p.parse_args(argv)
    out = build_all(args.out, args.cloud, args.python)
    print("\n".join(f"{out / v.name}  {v.size} bytes" for v in
                    agent_bundle.parse_manifest((out / agent_bundle.MANIFEST).read_bytes())))


if __name__ == "__main__":
    main()
