"""`jobplane local down` (issue 63: stopping a local cloud needed its process id): each cloud, AWS and GCP, stops
as Ctrl-C stops it, and the module's teardown finds it exited 0 with nothing it started alive. A module of its own
that takes over clouds another module left quiet (conftest.Kept), so downing them costs no start."""

from __future__ import annotations

import pytest

from jobplane.local.demo import CloudProcess
from tests.local.conftest import cli_ok

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(120)]
SHARES_CLOUDS = ("aws", "gcp")  # from another module, quiet; it ends them, so hands none on


def test_local_down_stops_the_cloud_of_the_state_dir(cloud: CloudProcess, gcp: CloudProcess) -> None:
    for each in (cloud, gcp):
        assert cli_ok(each, "local", "down").strip() == "local cloud stopped"
        assert each.proc is not None and each.proc.wait(timeout=30) == 0
        gone = each.cli("local", "status")
        assert gone.returncode == 1 and "no local cloud running" in gone.stderr, gone
