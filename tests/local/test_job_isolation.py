"""A hostile job on each local cloud (AWS: moto enforcing STS sessions; GCP: the GCS fake enforcing downscoped
tokens; the real vending function, launcher, bootstrap and agent): its script takes the credentials its agent
holds, the way anything with root on the VM can (the agent's own code, the VM's identity from the metadata
server, the vending URL), and turns them on another job's keys. Each try is refused; the same credentials work
on its own keys."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from jobplane.local.demo import CloudProcess
from jobplane.model import keys
from jobplane.model.states import State
from tests.local.conftest import cli_ok, submit, write_spec

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(420)]
SHARES_CLOUDS = ("aws", "gcp")  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs

# How the script gets the store its agent uses, and how a refusal reads, per cloud.
AWS_STORE = """
from botocore.exceptions import ClientError
from jobplane.clouds.aws_vend import vended_s3_client
from jobplane.clouds.s3 import S3Store

store = S3Store(bucket, vended_s3_client(env.get("JOBPLANE_REGION"), env["JOBPLANE_VEND_URL"], me,
                                         int(env["JOBPLANE_ATTEMPT"]), bucket + ("/" + root if root else "")))

def denial(exc):
    if isinstance(exc, AccessDenied):  # the store's own error for S3's 403
        return "AccessDenied"
    return exc.response["Error"]["Code"] if isinstance(exc, ClientError) else repr(exc)
"""

GCP_STORE = """
from jobplane.clouds.gce_metadata import HOST_ENV
from jobplane.clouds.gcp_vend import vended_credentials
from jobplane.clouds.gcs import GcsStore

creds = vended_credentials(env["JOBPLANE_VEND_URL"], me, int(env["JOBPLANE_ATTEMPT"]), env.get(HOST_ENV))
store = GcsStore(bucket, project=env.get("GOOGLE_CLOUD_PROJECT"), credentials=creds)

def denial(exc):
    return "Forbidden" if isinstance(exc, AccessDenied) else repr(exc)  # the store's own error for GCS's 403
"""

# The hostile script: the cloud's part, then the same tries on the victim's keys and on its own.
HOSTILE = """
import json, os, sys
env = os.environ
sys.path.insert(0, os.path.join(env.get("JOBPLANE_AGENT_HOME", "/opt/jobplane"), "site"))
from jobplane.clouds.base import AccessDenied
from jobplane.model.keys import split_uri

root = env.get("JOBPLANE_ROOT", "").strip("/")
bucket, me, victim = env["JOBPLANE_BUCKET"], env["JOBPLANE_JOB_ID"], env["VICTIM"]
{store}

def key(k):
    return (root + "/" if root else "") + k

def attempt(what, call):
    try:
        call()
        print(what, "ok", flush=True)
    except Exception as exc:
        print(what, denial(exc), flush=True)

own = json.loads(store.get(key("jobs/%s/job.json" % me)).data)
own_code = split_uri(own["spec"]["code"])[1]  # a URI: its key has the root already
teams = {{victim: env["VICTIM_OWNER"], me: own["spec"]["owner"]}}
for who, code, ckpt in ((victim, env["VICTIM_CODE"], key(env["VICTIM_CKPT"])),
                        (me, own_code, key("teams/%s/%s/checkpoints/probe.bin" % (teams[me], me)))):
    if who == me:
        store.put(ckpt, b"mine")
    record = json.loads(store.get(key("jobs/%s/job.json" % me)).data)
    forged = dict(record, owner="team-b", spec=dict(record["spec"], owner="team-b", code=env["VICTIM_CODE"]))
    attempt(who + " read code", lambda: store.get(code))
    attempt(who + " read job.json", lambda: store.get(key("jobs/%s/job.json" % who)))
    attempt(who + " write log", lambda: store.put(key("teams/%s/%s/logs/1/0/00009999.log" % (teams[who], who)),
                                                  b"forged\\n"))
    attempt(who + " write heartbeat", lambda: store.put(key("heartbeats/%s/1/7" % who), b"{{}}"))
    attempt(who + " delete checkpoint", lambda: store.delete(ckpt))
    # what the functions decide identity, scope and money on: never a job's to write, its own included
    attempt(who + " rewrite job.json", lambda: store.put(key("jobs/%s/job.json" % who), json.dumps(forged).encode()))
    attempt(who + " write event", lambda: store.put(key("jobs/%s/events/20260101T000000.000000Z-abcd-created.json"
                                                        % who), b"{{}}"))
    attempt(who + " write admission", lambda: store.put(key("admission/owners/%s.json" % teams[who]), b"{{}}"))
"""


# The victim: a job that saves a checkpoint and ends (its keys then all exist: code, record, logs, checkpoint).
VICTIM = """import os, pathlib
pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"], "model.ckpt").write_bytes(b"weights")
print("saved", flush=True)
"""

@pytest.mark.parametrize(("which", "script", "refused", "extra"), [
    ("cloud", AWS_STORE, "AccessDenied", {}),
    ("gcp", GCP_STORE, "Forbidden", {"cloud": "gcp", "instance_type": "e2-standard-2"}),
])
def test_a_jobs_credentials_are_refused_on_another_jobs_keys_and_work_on_its_own(
        request: pytest.FixtureRequest, tmp_path: Path, which: str, script: str, refused: str,
        extra: dict[str, str]) -> None:
    cloud: CloudProcess = request.getfixturevalue(which)
    reg = cloud.registry()
    victim_code = tmp_path / "victim"
    victim_code.mkdir()
    (victim_code / "save.py").write_text(VICTIM)
    victim = submit(cloud, write_spec(tmp_path, "victim", "python3 save.py", max_runtime="10m", **extra), victim_code)
    assert cloud.cli("wait", victim, "--timeout", "240s", timeout=270).returncode == 0, cli_ok(cloud, "logs", victim)
    record = reg.job(victim)
    assert record.spec.code
    ckpts = [k for k, _, _ in reg.listing(keys.checkpoints_prefix(record.data)) if "/files/" in k]
    assert ckpts, "the victim synced no checkpoint file"
    code_key = keys.split_uri(record.spec.code)[1]
    before = {k: reg.get_bytes(k) for k in ckpts}

    code = tmp_path / "hostile"
    code.mkdir()
    (code / "hostile.py").write_text(textwrap.dedent(HOSTILE.format(store=script)))
    env = {"VICTIM": victim, "VICTIM_CODE": code_key, "VICTIM_CKPT": ckpts[0], "VICTIM_OWNER": record.spec.owner}
    spec = write_spec(tmp_path, "hostile", "python3 hostile.py", max_runtime="10m", spot="false",
                      env="{" + ", ".join(f"{k}: '{v}'" for k, v in env.items()) + "}", **extra)
    hostile = submit(cloud, spec, code)
    assert cloud.cli("wait", hostile, "--timeout", "240s", timeout=270).returncode == 0
    out = cli_ok(cloud, "logs", hostile, "--attempt", "1")
    for what in ("read code", "read job.json", "write log", "write heartbeat", "delete checkpoint",
                 "rewrite job.json", "write event", "write admission"):
        assert re.search(rf"^{victim} {what} {refused}$", out, re.M), out
    for what in ("read code", "read job.json", "write log", "write heartbeat", "delete checkpoint"):
        assert re.search(rf"^{hostile} {what} ok$", out, re.M), out
    for what in ("rewrite job.json", "write event", "write admission"):  # its own record as much as another's
        assert re.search(rf"^{hostile} {what} {refused}$", out, re.M), out
    assert {k: reg.get_bytes(k) for k in ckpts} == before  # the victim's checkpoints are whole
    assert reg.job(hostile).spec.owner != "team-b"  # its record is the control plane's
    assert "forged" not in cli_ok(cloud, "logs", victim)
    assert reg.job(hostile).state == State.SUCCEEDED
