"""Boot images by name: an alias means the same OS on both clouds, resolved per cloud and CPU architecture.

On AWS an alias resolves to the public SSM parameter its publisher keeps pointing at the current AMI
(Canonical for Ubuntu, the AWS Deep Learning AMIs for the NVIDIA image, Debian for Debian), given to EC2
as `resolve:ssm:<parameter>`; on GCP to a public image family. A spec or policy may also name a raw image:
an AMI id or `resolve:ssm:<parameter>` on AWS, a GCE image or family path on GCP.

Every alias's image ships a python3 that the agent bundle is built for (`python`), which is all the
bootstrap needs. Pure: no cloud calls here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

X86_64, AARCH64 = "x86_64", "aarch64"
ARCHITECTURES = (X86_64, AARCH64)


@dataclass(frozen=True)
class Alias:
    name: str
    about: str
    python: str  # the image's python3 (major.minor)
    gpu: bool  # ships the NVIDIA driver and CUDA
    aws: Mapping[str, str]  # architecture -> public SSM parameter holding the AMI id
    gcp: Mapping[str, str]  # architecture -> public image family


_CANONICAL = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{}/hvm/ebs-gp3/ami-id"
_DLAMI = "/aws/service/deeplearning/ami/{}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
_DEBIAN = "/aws/service/debian/release/12/latest/{}"
_FAMILY = "projects/{}/global/images/family/{}"

ALIASES: dict[str, Alias] = {a.name: a for a in (
    Alias("ubuntu-24.04", "Ubuntu Server 24.04 LTS (Canonical)", "3.12", gpu=False,
          aws={X86_64: _CANONICAL.format("amd64"), AARCH64: _CANONICAL.format("arm64")},
          gcp={X86_64: _FAMILY.format("ubuntu-os-cloud", "ubuntu-2404-lts-amd64"),
               AARCH64: _FAMILY.format("ubuntu-os-cloud", "ubuntu-2404-lts-arm64")}),
    Alias("ubuntu-24.04-gpu", "Ubuntu 24.04 with the NVIDIA driver and CUDA (AWS Deep Learning Base OSS AMI; "
                              "Canonical's accelerator image on GCP)", "3.12", gpu=True,
          aws={X86_64: _DLAMI.format("x86_64"), AARCH64: _DLAMI.format("arm64")},
          gcp={X86_64: _FAMILY.format("ubuntu-os-accelerator-images", "ubuntu-accelerator-2404-amd64-with-nvidia-580"),
               AARCH64: _FAMILY.format("ubuntu-os-accelerator-images",
                                       "ubuntu-accelerator-2404-arm64-with-nvidia-580")}),
    Alias("debian-12", "Debian 12 bookworm (Debian's own cloud images)", "3.11", gpu=False,
          aws={X86_64: _DEBIAN.format("amd64"), AARCH64: _DEBIAN.format("arm64")},
          gcp={X86_64: _FAMILY.format("debian-cloud", "debian-12"),
               AARCH64: _FAMILY.format("debian-cloud", "debian-12-arm64")}),
)}
DEFAULT_CPU = "ubuntu-24.04"
DEFAULT_GPU = "ubuntu-24.04-gpu"

SSM_PREFIX = "resolve:ssm:"
_AMI = re.compile(r"^ami-[0-9a-f]{8}([0-9a-f]{9})?$")
_SSM = re.compile(r"^resolve:ssm:/?[A-Za-z0-9_.\-/]+(:[A-Za-z0-9_.\-]+)?$")
_GCE = re.compile(r"^(https://(www|compute)\.googleapis\.com/compute/(v1|beta)/)?(projects/[a-z0-9][a-z0-9.:-]*/)?"
                  r"global/images/(family/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_RAW_HELP = {"aws": "an AMI id (ami-...) or resolve:ssm:<parameter>",
             "gcp": "a GCE image path (projects/P/global/images/NAME or projects/P/global/images/family/F)"}

# EC2: p* and g* families carry GPUs (gr6 too); a "g" among the options after the generation means
# Graviton (c7g, m7gd, g5g, p6e-gb200), as does the first Graviton family, a1. GCE: the accelerator-optimized
# families (a2, a3, a4, a4x, g2, g4); Arm: t2a, c4a, n4a and a4x.
_EC2_FAMILY = re.compile(r"^([a-z]+)(\d+)([a-z0-9-]*)$")
_GCE_GPU = re.compile(r"^(a\d+[a-z]*|g[2-9])$")
_GCE_ARM = re.compile(r"^([a-z]\d+a|a\d+x)$")


def has_gpu(cloud: str, instance_type: str) -> bool:
    """Whether the instance type comes with GPUs (the policy's GPU default image applies)."""
    if cloud == "gcp":
        return bool(_GCE_GPU.match(instance_type.split("-")[0]))
    m = _EC2_FAMILY.match(instance_type.split(".")[0])
    return m is not None and m.group(1) in ("p", "g", "gr")


def architecture(cloud: str, instance_type: str) -> str:
    """x86_64 or aarch64: which image variant and agent bundle the instance type needs."""
    if cloud == "gcp":
        return AARCH64 if _GCE_ARM.match(instance_type.split("-")[0]) else X86_64
    m = _EC2_FAMILY.match(instance_type.split(".")[0])
    return AARCH64 if m and (m.group(1) == "a" or "g" in m.group(3)) else X86_64


def image_problem(cloud: str, image: str) -> str | None:
    """Why `image` cannot be used on this cloud, or None."""
    if image in ALIASES:
        return None
    if cloud == "aws" and (_AMI.match(image) or _SSM.match(image)):
        return None
    if cloud == "gcp" and _GCE.match(image):
        return None
    return (f"unknown image {image!r}: use an alias ({', '.join(ALIASES)}) or {_RAW_HELP.get(cloud, 'an image')} "
            f"for cloud {cloud!r}")


def resolve(cloud: str, image: str, instance_type: str) -> str:
    """What the cloud's launch call takes: an alias becomes resolve:ssm:<parameter> (AWS) or an image
    family (GCP) for the instance type's architecture; a raw image passes unchanged."""
    alias = ALIASES.get(image)
    if alias is None:
        return image
    arch = architecture(cloud, instance_type)
    return SSM_PREFIX + alias.aws[arch] if cloud == "aws" else alias.gcp[arch]


def python_versions() -> tuple[str, ...]:
    """Every python3 version the aliases' images ship, oldest first: the agent bundle covers each."""
    return tuple(sorted({a.python for a in ALIASES.values()}, key=lambda v: tuple(map(int, v.split(".")))))
