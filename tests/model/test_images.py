"""Image aliases: resolution per cloud and architecture, GPU and Arm detection, refusals that name `image`."""

from __future__ import annotations

import pytest

from jobplane.model import images
from jobplane.model.errors import SpecError
from jobplane.model.policy import DEFAULT_POLICY, parse_policy
from jobplane.model.spec import parse_spec
from tests.helpers import table


@pytest.mark.parametrize(("cloud", "itype", "gpu", "arch"), [
    ("aws", "t3.micro", False, "x86_64"),
    ("aws", "c7g.large", False, "aarch64"),
    ("aws", "m7gd.xlarge", False, "aarch64"),
    ("aws", "im4gn.large", False, "aarch64"),
    ("aws", "a1.medium", False, "aarch64"),
    ("aws", "m7i-flex.large", False, "x86_64"),
    ("aws", "g4dn.xlarge", True, "x86_64"),
    ("aws", "g5.12xlarge", True, "x86_64"),
    ("aws", "g6e.xlarge", True, "x86_64"),
    ("aws", "gr6.4xlarge", True, "x86_64"),
    ("aws", "g5g.xlarge", True, "aarch64"),
    ("aws", "p4d.24xlarge", True, "x86_64"),
    ("aws", "p5.48xlarge", True, "x86_64"),
    ("aws", "p6e-gb200.36xlarge", True, "aarch64"),
    ("aws", "trn1.2xlarge", False, "x86_64"),
    ("aws", "inf2.xlarge", False, "x86_64"),
    ("gcp", "n2-standard-4", False, "x86_64"),
    ("gcp", "g1-small", False, "x86_64"),
    ("gcp", "t2a-standard-4", False, "aarch64"),
    ("gcp", "c4a-standard-8", False, "aarch64"),
    ("gcp", "a2-highgpu-1g", True, "x86_64"),
    ("gcp", "a3-megagpu-8g", True, "x86_64"),
    ("gcp", "g2-standard-8", True, "x86_64"),
    ("gcp", "a4x-highgpu-4g", True, "aarch64"),
])
def test_gpu_and_architecture_from_the_instance_type(cloud: str, itype: str, gpu: bool, arch: str) -> None:
    assert images.has_gpu(cloud, itype) is gpu
    assert images.architecture(cloud, itype) == arch


SSM, UBUNTU_SSM = "resolve:ssm:/aws/service/", "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/"
DLAMI, FAMILY = "resolve:ssm:/aws/service/deeplearning/ami/", "projects/{}/global/images/family/"


@table(
    dict(cloud="aws", alias="ubuntu-24.04", itype="t3.micro", expected=UBUNTU_SSM + "amd64/hvm/ebs-gp3/ami-id"),
    dict(cloud="aws", alias="ubuntu-24.04", itype="c7g.large", expected=UBUNTU_SSM + "arm64/hvm/ebs-gp3/ami-id"),
    dict(cloud="aws", alias="ubuntu-24.04-gpu", itype="g5.xlarge",
         expected=DLAMI + "x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"),
    dict(cloud="aws", alias="ubuntu-24.04-gpu", itype="g5g.xlarge",
         expected=DLAMI + "arm64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"),
    dict(cloud="aws", alias="debian-12", itype="t3.micro", expected=SSM + "debian/release/12/latest/amd64"),
    dict(cloud="aws", alias="debian-12", itype="t4g.small", expected=SSM + "debian/release/12/latest/arm64"),
    dict(cloud="gcp", alias="ubuntu-24.04", itype="n2-standard-4",
         expected=FAMILY.format("ubuntu-os-cloud") + "ubuntu-2404-lts-amd64"),
    dict(cloud="gcp", alias="ubuntu-24.04", itype="t2a-standard-4",
         expected=FAMILY.format("ubuntu-os-cloud") + "ubuntu-2404-lts-arm64"),
    dict(cloud="gcp", alias="ubuntu-24.04-gpu", itype="g2-standard-8",
         expected=FAMILY.format("ubuntu-os-accelerator-images") + "ubuntu-accelerator-2404-amd64-with-nvidia-580"),
    dict(cloud="gcp", alias="debian-12", itype="n2-standard-4", expected=FAMILY.format("debian-cloud") + "debian-12"),
    dict(cloud="gcp", alias="debian-12", itype="c4a-standard-8",
         expected=FAMILY.format("debian-cloud") + "debian-12-arm64"),
)
def test_aliases_resolve_to_the_publishers_images(cloud: str, alias: str, itype: str, expected: str) -> None:
    """AWS: the publishers' public SSM parameters; GCP: their public image families."""
    assert images.resolve(cloud, alias, itype) == expected


def test_raw_images_pass_unchanged() -> None:
    for cloud, image in (("aws", "ami-0123456789abcdef0"), ("aws", "resolve:ssm:/my/golden-ami:3"),
                         ("gcp", "projects/my-proj/global/images/family/trainer"),
                         ("gcp", "https://www.googleapis.com/compute/v1/projects/p/global/images/img-1")):
        assert images.image_problem(cloud, image) is None
        assert images.resolve(cloud, image, "t3.micro") == image


def test_an_unknown_alias_is_refused_naming_image() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("run: x\ninstance_type: t3.micro\nimage: ubuntu-22.04\n")
    (err,) = info.value.errors
    assert err.path == "image" and "unknown image 'ubuntu-22.04'" in err.message and "debian-12" in err.message
    with pytest.raises(SpecError, match=r"image: unknown image 'ami-0123456789abcdef0'.*cloud 'gcp'"):
        parse_spec("run: x\ninstance_type: n2-standard-4\ncloud: gcp\nimage: ami-0123456789abcdef0\n")


def test_every_alias_has_both_architectures_on_both_clouds_and_a_python_the_agent_supports() -> None:
    for alias in images.ALIASES.values():
        assert set(alias.aws) == set(alias.gcp) == set(images.ARCHITECTURES), alias.name
        assert tuple(map(int, alias.python.split("."))) >= (3, 11), alias.name
    assert images.python_versions() == ("3.11", "3.12")


def test_policy_defaults_pick_the_gpu_or_cpu_alias_from_the_instance_type() -> None:
    cpu = parse_spec("run: x\ninstance_type: c5.xlarge\n")
    gpu = parse_spec("run: x\ninstance_type: g5.xlarge\n")
    assert DEFAULT_POLICY.image(cpu, "c5.xlarge") == "ubuntu-24.04"
    assert DEFAULT_POLICY.image(gpu, "g5.xlarge") == "ubuntu-24.04-gpu"
    own = parse_spec("run: x\ninstance_type: g5.xlarge\nimage: debian-12\n")
    assert DEFAULT_POLICY.image(own, "g5.xlarge") == "debian-12"
    policy = parse_policy("aws: {default_image: debian-12, default_gpu_image: 'resolve:ssm:/team/gpu-ami'}\n")
    assert policy.image(cpu, "c5.xlarge") == "debian-12"
    assert policy.image(gpu, "g5.xlarge") == "resolve:ssm:/team/gpu-ami"


def test_an_older_policy_with_one_default_image_keeps_using_it_for_gpus() -> None:
    policy = parse_policy("aws: {default_image: ami-0123456789abcdef0}\n")
    gpu = parse_spec("run: x\ninstance_type: p5.48xlarge\n")
    assert policy.image(gpu, "p5.48xlarge") == "ami-0123456789abcdef0"


def test_a_bad_policy_default_image_is_named() -> None:
    with pytest.raises(SpecError, match=r"gcp\.default_gpu_image: unknown image 'gpu'"):
        parse_policy("gcp: {default_gpu_image: gpu}\n")
