"""requirements.txt, as on SageMaker: the agent installs it with uv into a job environment before `setup`;
`python3` and `pip` in setup and run then mean that environment; a failed install fails the job naming the
file. The packages come from a package index on loopback (the local cloud's), never from PyPI."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.local.package_index import PackageIndex, wheel_dir
from jobplane.model import keys
from tests.agent.conftest import World, console_of
from tests.helpers import make_wheel

pytestmark = pytest.mark.timeout(120)
SEEDS = ("pip", "setuptools", "wheel", "packaging")  # what `uv venv --seed` installs (and wheel needs)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    """A loopback index with the seed packages (from the install step's cache) and one tiny package, in the
    agents' environment as the local cloud sets it for its instances."""
    cached = [w for name in SEEDS for w in wheel_dir().glob(f"{name}-*.whl")]
    if not all(any(w.name.startswith(f"{name}-") for w in cached) for name in SEEDS[:3]):
        pytest.skip(f"no pip/setuptools/wheel in {wheel_dir()}: run `make local-index`")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for wheel in cached:
        shutil.copy(wheel, wheels)
    make_wheel(wheels, "tinydep", "1.2.3", "GREETING = 'hello from tinydep'\n")
    server = PackageIndex(wheels)
    server.start()
    monkeypatch.setenv("UV_INDEX_URL", server.url)
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    try:
        yield server
    finally:
        server.stop()


CHECK = ("python3 -c \"import sys, tinydep; print('run:', tinydep.GREETING, 'in', sys.prefix)\" && "
         "pip --version | cut -d' ' -f1")


@pytest.mark.usefixtures("index")
def test_requirements_go_into_the_job_environment_before_setup(world: World) -> None:
    world.seed("reqs", {"setup": "echo setup sees $(command -v python3)", "run": CHECK},
               code={"requirements.txt": "tinydep==1.2.3\n"})
    node = world.start("reqs")
    assert node.wait(timeout=90) == 0, console_of(node)
    logs = world.logs("reqs")
    env = node.ml_root / "env"
    assert f"requirements.txt: installing into {env}" in logs
    assert "+ tinydep==1.2.3" in logs  # uv's own output is in the job's log
    assert f"setup sees {env}/bin/python3" in logs
    assert f"run: hello from tinydep in {env}" in logs
    assert logs.rstrip().splitlines()[-2].endswith("pip")  # `pip` on PATH is the job environment's
    assert logs.index("installed; python3 and pip now mean") < logs.index("setup: echo")
    assert world.json(keys.exit_report("reqs", 1, 0))["code"] == 0


@pytest.mark.usefixtures("index")
def test_a_failed_install_fails_the_job_naming_requirements_txt(world: World) -> None:
    world.seed("bad-reqs", {"setup": "touch setup-ran", "run": "touch run-ran"},
               code={"requirements.txt": "tinydep==1.2.3\nno-such-package-anywhere==0.1\n"})
    node = world.start("bad-reqs")
    assert node.wait(timeout=90) == 0, console_of(node)  # the agent reported; the job failed
    report = world.json(keys.exit_report("bad-reqs", 1, 0))
    assert report["code"] != 0 and report["reason"] == "exit"
    assert report["error"].startswith("requirements.txt: could not install it: uv exited with code")
    logs = world.logs("bad-reqs")
    assert "no-such-package-anywhere" in logs  # uv said which one
    assert not (node.ml_root / "code" / "setup-ran").exists() and not (node.ml_root / "code" / "run-ran").exists()
