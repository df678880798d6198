"""One local cloud (`jobplane local up` in a child process, AWS or GCP) per test module; stopped, and checked
to have left nothing behind, in the fixture's finalizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.local.demo import CloudProcess
from jobplane.local.package_index import wheel_dir

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train"


def running(tmp_path_factory: pytest.TempPathFactory, which: str, baked_agent: bool = True) -> Iterator[CloudProcess]:
    """A local cloud for a test module; stopped, and checked to have left nothing behind, at its end. Its VMs
    boot as from an image baked with the agent (`local up --baked-agent`: about 2 CPU seconds less per VM) unless
    the module tests the bootstrap's download itself (tests/local/test_first_job.py)."""
    if not any(wheel_dir().glob("numpy-*.whl")):  # examples/train/requirements.txt installs it, from loopback
        pytest.skip(f"the local package index is empty ({wheel_dir()}): run `make local-index`")
    proc = CloudProcess(tmp_path_factory.mktemp(f"local-{which}"), cloud=which, baked_agent=baked_agent)
    try:
        proc.start()
        yield proc
    finally:
        code = proc.stop()
        left = proc.leftovers()
        assert not left, f"the local cloud left {left} behind"
        assert code == 0, f"local up exited {code}; see {proc.state_dir / 'local-cloud.log'}"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    yield from running(tmp_path_factory, "aws")


@pytest.fixture(scope="module")
def gcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    yield from running(tmp_path_factory, "gcp")


def write_spec(directory: Path, name: str, run: str, **extra: str) -> Path:
    fields = {"name": name, "instance_type": "t3.micro", "spot": "true", "run": run, **extra}
    lines = [f"{k}: {v}" for k, v in fields.items()]
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_ok(cloud: CloudProcess, *args: str) -> str:
    """`jobplane ARGS`'s stdout; fails the test with its stderr if it exits non-zero."""
    done = cloud.cli(*args)
    assert done.returncode == 0, f"jobplane {' '.join(args)}: {done.stderr}"
    return done.stdout


def submit(cloud: CloudProcess, spec: Path, code: Path = TRAIN) -> str:
    """Submit a spec with its code; returns the job id."""
    return cli_ok(cloud, "submit", str(spec), "--code", str(code)).strip().splitlines()[-1]
