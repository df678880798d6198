"""Issue 60's scenario on both local clouds (AWS: moto's Parameter Store; GCP: the Secret Manager fake): a member of
team-s sets a random secret; a job of team-s naming it prints it 1,000 times raw, base64, URL-encoded and inside
JSON, and its sha256; the job saw the right value (its sha256 is in the logs), and no object of the bucket,
`jobplane logs`, `describe --json`, `ls`, the dashboard's job page or the notifications hold it in any form. A member
of team-t naming the same secret is refused at submit, and a drop of team-t written past submit runs a job whose
grant names team-t's secret of that name (none): it fails naming the field and never prints it."""

from __future__ import annotations

import base64
import hashlib
import secrets as random
import subprocess
import sys
from pathlib import Path

import pytest

from jobplane.agent.redact import forms
from jobplane.local.demo import REPO, CloudProcess
from jobplane.local.waiting import wait_for
from jobplane.model import keys
from jobplane.model.states import State
from tests.local.conftest import cli_ok, shell_code, write_spec
from tests.local.test_teams import member, run_as

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(300)]
SHARES_CLOUDS = ("aws", "gcp")  # quiet, to or from another module (conftest.Kept): others' objects widen its leak hunt

PRINTS = ("\"python3 -c 'import os,base64,json,hashlib,urllib.parse as u; v=os.environ[\\\"HF_TOKEN\\\"]; "
          "[print(v, base64.b64encode(v.encode()).decode(), u.quote(v, safe=\\\"\\\"), json.dumps({\\\"t\\\": v})) "
          "for _ in range(1000)]; print(\\\"sha256\\\", hashlib.sha256(v.encode()).hexdigest())'\"")


def leaks(text: bytes | str, value: bytes) -> list[bytes]:
    data = text.encode() if isinstance(text, str) else text
    return [f for f in forms(value) if f in data]


def ended(cloud: CloudProcess, job_id: str) -> State:
    reg = cloud.registry()
    wait_for(f"{job_id} ended", lambda: reg.exists(job_id) and reg.job(job_id).terminal, 180, 0.5)
    return State(reg.job(job_id).state)


@pytest.mark.parametrize("which", ["cloud", "gcp"])
def test_only_the_owning_teams_job_reads_the_secret_and_nothing_shows_it(request: pytest.FixtureRequest,
                                                                         tmp_path: Path, which: str) -> None:
    cloud: CloudProcess = request.getfixturevalue(which)
    extra = {"cloud": "gcp", "instance_type": "e2-standard-2"} if which == "gcp" else {}
    value = ("hf_" + random.token_urlsafe(24)).encode()
    s, t = member(cloud, "team-s"), member(cloud, "team-t")
    done = subprocess.run([sys.executable, "-m", "jobplane.cli", "secret", "set", "hf-token", "--owner", "team-s"],
                          env={**cloud.env, **s}, input=value + b"\n", capture_output=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    refused = run_as(cloud, t, "secret", "set", "hf-token", "--owner", "team-s")  # IAM: not its team's
    assert refused.returncode != 0
    code = shell_code(tmp_path)
    spec = write_spec(tmp_path, "reads", PRINTS, spot="false", owner="team-s", secrets="{HF_TOKEN: hf-token}",
                      **extra)
    submitted = run_as(cloud, s, "submit", str(spec), "--code", str(code))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[-1]

    theirs = write_spec(tmp_path, "steals", PRINTS, spot="false", owner="team-t", secrets="{HF_TOKEN: hf-token}",
                        **extra)
    refused = run_as(cloud, t, "submit", str(theirs), "--code", str(code))
    assert refused.returncode != 0 and "secrets.HF_TOKEN" in refused.stderr + refused.stdout
    # past submit: a drop of team-t's own (its folder is its to write); the grant names team-t's hf-token, none
    cloud.registry().put(keys.queue_entry("steal", "team-t"), theirs.read_bytes())

    assert ended(cloud, job) == State.SUCCEEDED, (cloud.registry().job(job).reason, cli_ok(cloud, "logs", job)[-3000:])
    assert ended(cloud, "steal") == State.FAILED
    reg = cloud.registry()
    stolen = reg.job("steal")
    every = b"".join(reg.get_bytes(key) for key, _, _ in reg.listing(""))
    assert f"sha256 {hashlib.sha256(value).hexdigest()}".encode() in every  # the job saw the right value
    assert every.count(b"***") >= 4000
    assert not leaks(every, value), "an object of the bucket holds the secret"
    assert "secrets" in (stolen.reason or "")  # refused by IAM, naming the field

    outputs = [cli_ok(cloud, "logs", job), cli_ok(cloud, "describe", job, "--json"), cli_ok(cloud, "ls"),
               cli_ok(cloud, "describe", "steal", "--json"), (cloud.state_dir / "local-cloud.log").read_text()]
    assert "notified" in outputs[-1] and job in outputs[-1]  # the notifications were sent, and say no value
    for text in outputs:
        assert not leaks(text, value)
    assert base64.b64encode(value) not in every

    from jobplane import sdk
    from tests.ui.apps import served
    with cloud.environment():
        page = served(sdk.Client()).get(f"/jobs/{job}")
    assert page.status_code == 200 and job in page.text and not leaks(page.text, value)
