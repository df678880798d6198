"""The agent with a `container:` job on a VM image without a container runtime: FAILED naming container.image, no
phase run. (A real runtime runs in the local cloud: tests/local/test_container_job.py.)"""

from __future__ import annotations

import pytest

from jobplane.model import keys
from tests.agent.conftest import World, console_of

pytestmark = pytest.mark.timeout(60)


def test_no_runtime_on_the_image_fails_the_job_naming_container_image(world: World) -> None:
    world.path = str(world.tmp / "bin")  # the power shims only: no podman, no docker
    world.seed("boxed", {"container": {"image": "python:3.12"}, "setup": "touch setup-ran", "run": "touch run-ran"})
    node = world.start("boxed")
    assert node.wait(timeout=40) == 0, console_of(node)  # the agent reported; the job failed
    report = world.json(keys.exit_report("boxed", 1, 0))
    assert report["code"] == 125 and report["reason"] == "exit"
    assert report["error"].startswith("container.image: this VM's image has no container runtime (podman or docker)")
    assert not (node.ml_root / "code" / "setup-ran").exists() and not (node.ml_root / "code" / "run-ran").exists()
    assert world.poweroff_log.read_text().strip() == "-h now"
