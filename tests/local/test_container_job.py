"""A `container:` job on the local cloud, for real: a VM of the Debian 12 + podman image pulls jobplane/debian:12
from the registry on loopback and runs the job in it with podman. The job prints the container's
/etc/os-release and its PID 1, sees SM_MODEL_DIR and its checkpoint directory, rewrites its checkpoint in place
with no SIGTERM handler, is preempted, and attempt 2 resumes from that checkpoint inside a new container. An
image the registry does not have fails the job naming container.image. On the local GCP cloud, a container job
runs to the end through GCP's bootstrap and agent."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from jobplane.decide.rules import Rule
from jobplane.local import oci_registry, rootfs
from jobplane.local.aws import PODMAN_PARAMETER
from jobplane.local.demo import CloudProcess, wait_for_no_instances
from jobplane.local.gcp import PODMAN_IMAGE
from jobplane.model.states import State
from tests.local.conftest import cli_ok, submit, write_spec
from tests.local.test_checkpoint_habits import (
    JSON_EVERY_HALF_SECOND,
    before_the_notice,
    logs,
    preempt,
    resumed_at,
    wait_saved,
)

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(420)]
SHARES_CLOUDS = ("aws", "gcp")  # quiet, to or from another module (conftest.Kept): its checks read only its jobs

# what the job sees in its container, then the JSON habit: a checkpoint rewritten in place, SIGTERM ignored
TRAIN = """
import os, pathlib
release = dict(line.split("=", 1) for line in open("/etc/os-release").read().split("\\n") if "=" in line)
print("os-release:", release["PRETTY_NAME"].strip('"'), flush=True)
print("pid 1:", open("/proc/1/cmdline").read().split("\\0")[0], flush=True)
print("podman here:", any(os.path.exists(p + "/podman") for p in os.environ["PATH"].split(":")), flush=True)
print("SM_MODEL_DIR:", os.environ["SM_MODEL_DIR"], os.path.isdir(os.environ["SM_MODEL_DIR"]), flush=True)
ckpt = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"])
print("checkpoint dir:", ckpt, ckpt.is_dir(), flush=True)
""" + JSON_EVERY_HALF_SECOND


@pytest.fixture(scope="module", autouse=True)
def images_built() -> None:
    problem = rootfs.podman_image_problem() or oci_registry.image_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def jobs(cloud: CloudProcess, gcp: CloudProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every job of the module, submitted up front on both clouds: each runs while the tests before its own wait, so
    the module takes about its longest job, not the sum (and neither cloud idles through the other's job)."""
    tmp = tmp_path_factory.mktemp("container-jobs")
    image = json.loads(cli_ok(cloud, "local", "status"))["oci_image"]  # where a user finds it, and local up says it
    missing = cloud.state["oci_image"].rsplit("/", 2)[0] + "/jobplane/no-such-image:1"
    gcp_spec = write_spec(tmp, "boxed-gcp", "python3 train.py", cloud="gcp", instance_type="e2-standard-2",
                          spot="false", image=PODMAN_IMAGE, container=gcp.state["oci_image"],  # the image alone
                          env="{STEPS: '2'}")
    return {"image": image, "missing": missing,
            "boxed": submit(cloud, container_spec(tmp, "boxed", image), code(tmp)),
            "boxed-missing": submit(cloud, container_spec(tmp, "boxed-missing", missing), code(tmp)),
            "boxed-gcp": submit(gcp, gcp_spec, code(tmp))}


def container_spec(tmp_path: Path, name: str, image: str) -> Path:
    return write_spec(tmp_path, name, "python3 train.py", image=f"resolve:ssm:{PODMAN_PARAMETER}",
                      container=f"{{image: '{image}'}}", max_restarts="2", max_runtime="15m")


def code(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir(exist_ok=True)
    (directory / "train.py").write_text(textwrap.dedent(TRAIN))
    return directory


def test_a_container_job_is_preempted_and_resumes_from_its_checkpoint_in_a_new_container(
        cloud: CloudProcess, jobs: dict[str, str]) -> None:
    image, job_id = jobs["image"], jobs["boxed"]
    assert image == cloud.state["oci_image"] and image in (cloud.state_dir / "local-cloud.log").read_text()
    wait_saved(cloud, job_id, 6)
    preempt(cloud, job_id)
    done = cloud.cli("wait", job_id, "--timeout", "300s", timeout=330)
    record = cloud.registry().job(job_id)
    assert (done.returncode, record.state, record.attempt) == (0, State.SUCCEEDED, 2), record.reason
    first, second = logs(cloud, job_id, 1), logs(cloud, job_id, 2)
    for text in (first, second):
        assert f"container: pulling {image} with podman" in text, text
        assert "os-release: Debian GNU/Linux 12 (bookworm)" in text
        assert re.search(r"^pid 1: /run/podman-init$", text, re.M) or "pid 1: catatonit" in text, text
        assert "podman here: False" in text  # the job's processes see the image, not the VM
        assert "SM_MODEL_DIR: /opt/ml/model True" in text and "checkpoint dir: /opt/ml/checkpoints True" in text
    assert "preempted: SIGTERM to the container's processes" in first
    assert resumed_at(second) >= before_the_notice(first) - 1, first
    assert re.search(r"restored 1 checkpoint files into", second), second


def test_an_image_the_registry_does_not_have_fails_the_job_naming_container_image(
        cloud: CloudProcess, jobs: dict[str, str]) -> None:
    missing, job_id = jobs["missing"], jobs["boxed-missing"]
    done = cloud.cli("wait", job_id, "--timeout", "180s", timeout=200)
    record = cloud.registry().job(job_id)
    assert done.returncode != 0 and (record.state, record.cause) == (State.FAILED, Rule.FINISHED), record.reason
    # the agent's error quoting podman: a message for people, checked as such
    assert f"container.image: could not pull {missing}: Error: " in (record.reason or ""), record.reason
    assert "no-such-image: name unknown (podman pull exited with code 125)" in (record.reason or ""), record.reason
    assert "os-release" not in cli_ok(cloud, "logs", job_id)


def test_a_container_job_runs_on_the_local_gcp_cloud(gcp: CloudProcess, jobs: dict[str, str]) -> None:
    image, job_id = gcp.state["oci_image"], jobs["boxed-gcp"]
    done = gcp.cli("wait", job_id, "--timeout", "240s", timeout=260)
    record = gcp.registry().job(job_id)
    text = cli_ok(gcp, "logs", job_id)
    assert (done.returncode, record.state) == (0, State.SUCCEEDED), f"{record.reason}\n{text}"
    assert f"container: pulling {image} with podman" in text and "os-release: Debian GNU/Linux 12" in text
    assert "SM_MODEL_DIR: /opt/ml/model True" in text and "podman here: False" in text
    assert not wait_for_no_instances(gcp, 60)
