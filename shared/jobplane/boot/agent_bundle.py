"""The agent bundle: what a VM runs the agent from, needing nothing on the image but python3.

One gzipped tar per (cloud, Python minor version, CPU architecture), built at deploy time
(jobplane.boot.bundling) and kept in the registry under system/agent/ with a manifest that lists every
variant's name, size and sha256. A bundle unpacks to
    site/          jobplane and the packages the agent imports on that cloud, for that Python and arch
    site/bin/uv    uv, which builds the job's environment from a requirements.txt
The launcher reads the manifest, hands the VM a URL and the sha256 of each variant for its architecture,
and the bootstrap picks the one for the image's python3 (jobplane.boot.bootstrap).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

FORMAT = 1
MANIFEST = "manifest.json"
SITE = "site"  # the directory the bundle unpacks its packages into (PYTHONPATH)


@dataclass(frozen=True)
class Variant:
    cloud: str
    python: str  # "3.12"
    arch: str  # x86_64 | aarch64
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return file_name(self.cloud, self.python, self.arch)


def file_name(cloud: str, python: str, arch: str) -> str:
    return f"{cloud}-py{python}-{arch}.tar.gz"


def manifest(variants: Iterable[Variant]) -> bytes:
    ordered = sorted(variants, key=lambda v: (v.cloud, v.arch, tuple(map(int, v.python.split(".")))))
    body = {"format": FORMAT, "variants": [{"name": v.name, **asdict(v)} for v in ordered]}
    return (json.dumps(body, indent=1) + "\n").encode()


def parse_manifest(data: bytes) -> list[Variant]:
    """The variants a manifest lists; ValueError if it is not one this version understands."""
    body = json.loads(data)
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("variants"), list):
        raise ValueError(f"not an agent bundle manifest of format {FORMAT}")
    return [Variant(str(v["cloud"]), str(v["python"]), str(v["arch"]), str(v["sha256"]), int(v["size"]))
            for v in body["variants"]]


def for_vm(variants: Iterable[Variant], cloud: str, arch: str) -> dict[str, Variant]:
    """python version -> variant, for a VM of this cloud and architecture."""
    return {v.python: v for v in variants if v.cloud == cloud and v.arch == arch}
