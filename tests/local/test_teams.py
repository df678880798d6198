"""Two teams on one deployment, each person under the deployment's own grants to a team member (AWS: a role tagged
jobplane-owner=<team> with the stack's submitter policy, enforced by the local moto; GCP: a member of the module's
submitters[<team>], enforced by the GCS fake): team A sees team B's job in `ls` but is refused its logs, its
checkpoints, a raw read of its keys and its cancel; team A cancels its own running job, which the control plane
stops (CANCELLED, its VM gone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobplane.local.demo import REPO, CloudProcess
from jobplane.local.waiting import wait_for
from jobplane.model import keys
from jobplane.model.states import State
from tests.local.conftest import ModuleCloud, cli_ok, shell_code, write_spec

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(300)]
SHARES_CLOUDS = ("aws", "gcp")  # quiet, to or from another module (conftest.Kept): its checks read only its jobs

# a job that saves a checkpoint, prints, and runs until it is stopped
WORKS = ("\"mkdir -p $JOBPLANE_CHECKPOINT_DIR && echo weights > $JOBPLANE_CHECKPOINT_DIR/model.ckpt && "
         "echo step 1 && sleep 600\"")


# a raw read of each key given, and a write of a cancel request in team B's folder, with the shell's credentials
RAW = """
import sys
from jobplane.clouds.base import AccessDenied
from jobplane.ops import backend
from jobplane.settings import Settings
reg = backend.registry(Settings.from_env())
def denied(call):
    try:
        call()
        print("allowed")
    except AccessDenied:
        print("denied")
for key in sys.argv[1:]:
    denied(lambda: reg.get_bytes(key))
denied(lambda: reg.put("cancels/team-b/x", b"{}"))
"""


def member(cloud: CloudProcess, team: str) -> dict[str, str]:
    """The exports of a member of `team` (`jobplane local as TEAM`)."""
    out = cli_ok(cloud, "local", "as", team)
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines() if line.startswith("export "))


def run_as(cloud: CloudProcess, person: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`jobplane ARGS` in a second shell that sourced a member's exports (a process of its own, forked warm: one
    process holds one identity, its clients made once)."""
    assert isinstance(cloud, ModuleCloud)
    return cloud.warm.run([sys.executable, "-m", "jobplane.cli", *args], env={**cloud.env, **person}, text=True,
                          timeout=90, capture_output=True, cwd=REPO)


def running(cloud: CloudProcess, job_id: str) -> None:
    reg = cloud.registry()
    wait_for(f"{job_id} running", lambda: reg.exists(job_id) and reg.job(job_id).state == State.RUNNING, 150, 0.5)


@pytest.mark.parametrize("which", ["cloud", "gcp"])
def test_a_team_reads_and_cancels_its_own_jobs_and_is_refused_another_teams(
        request: pytest.FixtureRequest, tmp_path: Path, which: str) -> None:
    cloud: CloudProcess = request.getfixturevalue(which)
    extra = {"cloud": "gcp", "instance_type": "e2-standard-2"} if which == "gcp" else {}
    a, b = member(cloud, "team-a"), member(cloud, "team-b")
    code = shell_code(tmp_path)
    theirs = run_as(cloud, b, "submit", str(write_spec(tmp_path, "theirs", WORKS, spot="false", **extra)),
                    "--code", str(code))
    assert theirs.returncode == 0, theirs.stderr
    mine = run_as(cloud, a, "submit", str(write_spec(tmp_path, "mine", WORKS, spot="false", **extra)),
                  "--code", str(code))
    assert mine.returncode == 0, mine.stderr
    b_job, a_job = theirs.stdout.split()[-1], mine.stdout.split()[-1]
    reg = cloud.registry()
    running(cloud, b_job)
    running(cloud, a_job)
    b_data = reg.job(b_job).data
    assert b_data.folder == f"teams/team-b/{b_job}/"
    wait_for("team B's checkpoint", lambda: list(reg.listing(keys.checkpoints_prefix(b_data) + "files/")), 60, 0.5)
    wait_for("team B's output", lambda: list(reg.listing(keys.logs_prefix(b_data))), 60, 0.5)

    # every team sees every job's record ...
    listed = run_as(cloud, a, "ls")
    assert listed.returncode == 0 and b_job in listed.stdout and a_job in listed.stdout, listed
    # ... and only its own team's data, and cancels only its own team's jobs
    for args in (("logs", b_job), ("checkpoints", b_job), ("cancel", b_job)):
        refused = run_as(cloud, a, *args)
        assert refused.returncode != 0, (args, refused.stdout)
        assert f"job {b_job} belongs to team-b" in refused.stderr, (args, refused.stderr)
    raw = subprocess.run([sys.executable, "-c", RAW, keys.log_chunk(b_data, 1, 0, 0),
                          keys.checkpoints_prefix(b_data) + "manifests/0/00000001.json",
                          keys.code_upload("team-b", b_job)], env={**cloud.env, **a}, text=True, timeout=90,
                         capture_output=True, cwd=REPO)
    assert raw.stdout.split() == ["denied"] * 4, (raw.stdout, raw.stderr)
    assert reg.job(b_job).state == State.RUNNING

    assert "step 1" in cli_ok(cloud, "logs", b_job)  # the platform team reads every team's
    assert run_as(cloud, b, "checkpoints", b_job).returncode == 0
    mine_logs = run_as(cloud, a, "logs", a_job)
    assert mine_logs.returncode == 0, mine_logs.stderr
    cancelled = run_as(cloud, a, "cancel", a_job)
    assert cancelled.returncode == 0 and f"{a_job} CANCELLED" in cancelled.stdout, (cancelled.stdout, cancelled.stderr)
    assert reg.job(a_job).reason == "cancelled by a member of team-a"
    wait_for(f"{a_job}'s VM gone", lambda: not [i for i in cloud.vms()
                                                if i.job_id == a_job and i.state in ("pending", "running")], 90, 1)
    cli_ok(cloud, "cancel", b_job, "--force")  # the platform team cancels any

