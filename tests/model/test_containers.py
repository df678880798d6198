"""A job's container: the spec's `container:` field, its errors naming the field, and the command lines the agent
runs (pure); the ECR login with the VM's identity (moto). The container itself runs in the local cloud's
scenario (tests/local/test_container_job.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from jobplane.clouds.aws_ecr import ecr_login
from jobplane.model import containers
from jobplane.model.errors import SpecError
from jobplane.model.spec import parse_spec

BASE = "instance_type: m5.large\nrun: python3 train.py\n"


def errors(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        parse_spec(BASE + text)
    return {e.path: e.message for e in err.value.errors}


@pytest.mark.parametrize("image", [
    "python:3.12", "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v3",
    "us-central1-docker.pkg.dev/proj/repo/train@sha256:" + "a" * 64, "127.0.0.1:5000/jobplane/debian:12", "localhost/x",
    "docker://nvcr.io/nvidia/pytorch:24.08-py3"])
def test_image_references_that_runtimes_take(image: str) -> None:
    spec = parse_spec(BASE + f"container: {{image: '{image}'}}\n")
    assert spec.container is not None and spec.container.image == image and spec.container.args == []


def test_the_short_form_is_the_image_alone() -> None:
    spec = parse_spec(BASE + "container: python:3.12\n")
    assert spec.container is not None and spec.container.image == "python:3.12"


@pytest.mark.parametrize(("text", "field", "words"), [
    ("container: {image: 'Pytorch/pytorch:2'}", "container.image", "not an image reference"),
    ("container: {image: 'python:3.12 && rm -rf /'}", "container.image", "not an image reference"),
    ("container: {image: ''}", "container.image", "at least 1"),
    ("container: {args: [--ipc=host]}", "container.image", "required"),
    ("container: {image: python, args: [--network=bridge]}", "container.args[0]", "--network is set by jobplane"),
    ("container: {image: python, args: [--shm-size=1g, --name, x]}", "container.args[1]", "--name is set by jobplane"),
    ("container: {image: python, args: [--shm-size=1g, x]}", "container.args[1]", "is not an option"),
    ("container: {image: python, pull: always}", "container.pull", "unknown field"),
    ("image: docker://python:3.12", "image", "give it as `container: {image: python:3.12}`"),
])
def test_errors_name_the_field(text: str, field: str, words: str) -> None:
    found = errors(text + "\n")
    assert field in found and words in found[field], found


@pytest.mark.parametrize(("arg", "owned"), [
    ("-itd", "-i"), ("-dt", "-d"), ("-td", "-t"), ("-d=true", "-d"),  # detached: the runtime returns at once
    ("-w/elsewhere", "-w"), ("-w=/elsewhere", "-w"), ("--workdir=/elsewhere", "--workdir"), ("--detach", "--detach"),
    ("--detach=true", "--detach"), ("-Pd", "-d"),
])
def test_owned_options_are_found_in_clusters_and_with_attached_values(arg: str, owned: str) -> None:
    found = errors(f"container: {{image: python, args: [--shm-size=1g, '{arg}']}}\n")
    assert found == {"container.args[1]": f"{owned} is set by jobplane (the job's container is named, removed, on "
                                          "the VM's network, runs setup and run in its working directory, and the "
                                          "job ends when it exits)"}


@pytest.mark.parametrize("arg", ["-eFOO=1", "-edt=1", "-e=DEBUG", "-p8080:80", "-v/data:/data", "-P", "-uroot",
                                 "--shm-size=16g", "--env=FOO=d"])
def test_a_value_attached_to_a_short_option_is_not_read_as_options(arg: str) -> None:
    spec = parse_spec(BASE + f"container: {{image: python, args: ['{arg}']}}\n")
    assert spec.container is not None and spec.container.args == [arg]


@pytest.mark.parametrize(("arg", "words"), [
    ("-e", "-e needs its value in the same argument (-eVALUE): the next one is jobplane's"),
    ("-Pv", "-v needs its value in the same argument"),
    ("--", "'--' ends the runtime's options"),
])
def test_an_option_that_would_take_jobplanes_next_argument_is_refused(arg: str, words: str) -> None:
    found = errors(f"container: {{image: python, args: ['{arg}']}}\n")
    assert words in found["container.args[0]"], found


def test_the_json_schema_has_both_forms() -> None:
    from jobplane.model.spec import json_schema

    prop = json_schema()["properties"]["container"]
    forms = prop["anyOf"]
    assert forms[0]["type"] == "string" and set(forms[1]["properties"]) == {"image", "args", "registry_auth"}


def test_a_short_name_is_qualified_for_podman_and_the_registry_found() -> None:
    assert containers.fully_qualified("python:3.12") == "docker.io/library/python:3.12"
    assert containers.fully_qualified("pytorch/pytorch:2") == "docker.io/pytorch/pytorch:2"
    assert containers.fully_qualified("docker://ghcr.io/a/b:1") == "ghcr.io/a/b:1"
    assert containers.registry_host("pytorch/pytorch:2") == "docker.io"
    assert containers.registry_host("123456789012.dkr.ecr.eu-west-1.amazonaws.com/t:1") == \
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    assert containers.registry_host("localhost:5000/x") == "localhost:5000"


def test_a_phase_runs_on_the_vms_network_with_the_jobs_paths_and_variables_by_name() -> None:
    argv = containers.run_argv("/usr/bin/podman", image="python:3.12", name="jobplane-j-2-0", command="python3 t.py",
                               workdir=Path("/opt/ml/code"), mounts=[Path("/opt/ml"), Path("/data/ckpt")],
                               env_names=["SM_MODEL_DIR", "NODE_RANK"], options=["--shm-size=8g"], gpus=4)
    joined = " ".join(argv)
    assert argv[:2] == ["/usr/bin/podman", "run"]
    for part in ("--rm --init --network host --pull never --name jobplane-j-2-0",
                 f"--env {containers.MARKER} --workdir /opt/ml/code", "--volume /data/ckpt:/data/ckpt",
                 "--volume /opt/ml:/opt/ml", "--env NODE_RANK --env SM_MODEL_DIR",
                 "--device nvidia.com/gpu=all --shm-size=8g --entrypoint /bin/sh docker.io/library/python:3.12 -c"):
        assert part in joined, part
    assert argv[-1] == "python3 t.py" and "exec bash" in argv[-2]
    assert "=" not in " ".join(a for a in argv if a.startswith("--env")), "values never in argv"
    docker = containers.run_argv("docker", image="x", name="n", command="c", workdir=Path("/w"), mounts=[],
                                 env_names=[], gpus=1)
    assert "--gpus all" in " ".join(docker) and "nvidia.com/gpu" not in " ".join(docker)
    assert "--gpus" not in containers.run_argv("docker", image="x", name="n", command="c", workdir=Path("/w"),
                                               mounts=[], env_names=[])


def test_the_vms_own_variables_stay_out_of_the_container() -> None:
    assert containers.env_names({"PATH": "/x", "HOME": "/root", "SM_HPS": "{}", "VIRTUAL_ENV": "/v", "LR": "1"}) == \
        ["SM_HPS", "LR"]


@mock_aws
def test_ecr_is_logged_in_to_with_the_vms_identity_in_the_registrys_region() -> None:
    login = ecr_login()
    user, password = login("123456789012.dkr.ecr.eu-west-1.amazonaws.com") or ("", "")
    token = boto3.client("ecr", region_name="eu-west-1").get_authorization_token()["authorizationData"][0]
    assert (user, password) == tuple(base64.b64decode(token["authorizationToken"]).decode().split(":", 1))
    assert user == "AWS" and password
    assert login("docker.io") is None and login("ghcr.io") is None
    assert login("123456789012.dkr.ecr.eu-west-1.amazonaws.com.evil.example") is None
