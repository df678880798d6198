"""The first real job on a fresh deployment, on the local cloud: the real launcher resolves the policy's
default image alias through the vendors' SSM parameters, the VM runs the real bootstrap (python3 only:
fetch the agent bundle by presigned URL, check it, unpack it), the agent installs requirements.txt with uv
from a package index on loopback, and the job runs. One job boots the stock Debian 12 image (debootstrap:
python3 and nothing else); another boots with its agent bundle gone and must fail at once, pointing at its
console output, which `jobplane logs` prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.boot import agent_bundle
from jobplane.local import rootfs
from jobplane.local.demo import CloudProcess, wait_for_no_instances
from jobplane.model import images, keys
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import policy_over, running, write_spec

pytestmark = pytest.mark.scenario


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    """This module's VMs run the whole bootstrap (no baked agent): it is what the module tests."""
    yield from running(tmp_path_factory, "aws", None, baked_agent=False)


# Run on the image: what it lacks (checked with its own python3, not the job environment's), what power
# commands it has, and then numpy from the job environment.
TRAIN = """\
import subprocess, sys
import numpy as np
image = {m: subprocess.run(["/usr/bin/python3", "-c", "import " + m], capture_output=True).returncode == 0
         for m in ("pip", "ensurepip", "jobplane", "boto3", "numpy")}
print("image modules:", sorted(m for m, ok in image.items() if ok) or "none of", sorted(image))
print("numpy", np.__version__, "from", np.__file__)
print("mean", float(np.arange(10).mean()))
"""
PROBE = ("echo os: $(. /etc/os-release && echo $PRETTY_NAME); echo marker: $(ls /usr/lib/python3*/EXTERNALLY-MANAGED); "
         "echo power: $(for c in shutdown poweroff halt reboot; do for p in $(type -ap $c); do readlink -f $p; done; "
         "done | sort -u | tr \\\\n \\ ); "
         "echo aws cli: $(command -v aws || echo none)")


def submit(cloud: CloudProcess, tmp_path: Path, name: str, **extra: str) -> str:
    code = tmp_path / f"{name}-code"
    code.mkdir()
    (code / "requirements.txt").write_text("numpy\n")
    (code / "train.py").write_text(TRAIN)
    spec = write_spec(tmp_path, name, "python3 train.py", **extra)
    done = cloud.cli("submit", str(spec), "--code", str(code))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(400)
def test_a_job_with_requirements_and_no_image_succeeds_on_stock_debian_12(cloud: CloudProcess, tmp_path: Path) -> None:
    if problem := rootfs.image_problem():
        pytest.skip(problem)  # `make local-images` builds it
    image = rootfs.image_dir()
    assert not list(image.glob("usr/lib/python3*/*-packages/pip")) and not list(image.glob("usr/bin/pip*"))
    assert not (image / "usr" / "lib" / "python3.11" / "ensurepip").exists()
    assert (image / "usr" / "lib" / "python3.11" / "EXTERNALLY-MANAGED").exists()
    reg = cloud.registry()
    with policy_over(cloud, {"aws": {"default_image": "debian-12"}}):  # as a team would (the loopback subnets stay)
        job_id = submit(cloud, tmp_path, "stock-debian", setup=f"'{PROBE}'", max_runtime="15m")
        wait_for("the job to end", lambda: reg.exists(job_id) and reg.job(job_id).terminal, 300, every=1.0)
    record = reg.job(job_id)
    logs = cloud.cli("logs", job_id)
    assert record.state == State.SUCCEEDED, f"{record.state}: {record.reason}\n{logs.stdout}"
    launched = next(e for e in reg.events(job_id) if "image" in e)
    assert launched["image"] == "resolve:ssm:" + images.ALIASES["debian-12"].aws[images.X86_64]
    out = logs.stdout
    assert "os: Debian GNU/Linux 12 (bookworm)" in out and "marker: /usr/lib/python3.11/EXTERNALLY-MANAGED" in out
    assert "power: /usr/sbin/halt /usr/sbin/poweroff /usr/sbin/reboot /usr/sbin/shutdown" in out  # the shims only
    assert "aws cli: none" in out
    assert "requirements.txt: installing into /opt/ml/env" in out and "+ numpy==" in out
    assert "image modules: none of ['boto3', 'ensurepip', 'jobplane', 'numpy', 'pip']" in out
    assert "from /opt/ml/env/lib/python3.11/site-packages/numpy/__init__.py" in out
    assert "mean 4.5" in out
    assert not wait_for_no_instances(cloud, 60)


@pytest.mark.timeout(300)
def test_a_failed_bootstrap_fails_the_job_pointing_at_the_console_which_logs_prints(
        cloud: CloudProcess, tmp_path: Path) -> None:
    reg = cloud.registry()
    (variant,) = agent_bundle.parse_manifest(reg.get_bytes(keys.agent_file(agent_bundle.MANIFEST)))
    bundle = reg.get_bytes(keys.agent_file(variant.name))
    reg.delete(keys.agent_file(variant.name))  # the presigned URL the VM gets now reads a 404
    try:
        job_id = submit(cloud, tmp_path, "no-bundle")
        wait_for("the job to fail", lambda: reg.exists(job_id) and reg.job(job_id).terminal, 120, every=1.0)
    finally:
        reg.store.put(keys.agent_file(variant.name), bundle)
    record = reg.job(job_id)
    assert record.state == State.FAILED
    assert record.reason.lower() == (f"the agent could not start: cannot download the agent bundle {variant.name}: "
                                     f"http error 404: not found (the vm's console output is in `jobplane logs "
                                     f"{job_id} --attempt 1`)").lower()
    assert record.attempt == 1 and record.restarts == 0  # failed at once: no boot timeout, no retry
    logs = cloud.cli("logs", job_id, "--attempt", "1")
    assert logs.returncode == 0, logs.stderr
    assert f"---- console output of {record.instances[0]} (rank 0, attempt 1), saved by the sweeper ----" in logs.stdout
    assert f"jobplane-bootstrap: FAILED: cannot download the agent bundle {variant.name}" in logs.stdout
    assert not wait_for_no_instances(cloud, 60)
