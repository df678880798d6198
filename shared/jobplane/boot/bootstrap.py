"""The VM startup script (EC2 user-data, GCE startup-script). It needs nothing on the image but bash and
python3: no cloud CLI, no pip, no venv module.

Only where the registry is (cloud, bucket, root, region), which job and attempt this VM serves, where the
agent comes from and where it asks for its job's credentials reach the script, each through shlex.quote.
Nothing from the spec's setup, run, env, name or labels does: the agent reads those from the registry. The
script
  1. schedules `shutdown -h +N` at the uptime cap (plus the spec's debug_hold), a backstop that holds even if the
     agent dies (EC2 terminates on shutdown; GCE also enforces max_run_duration natively);
  2. with python3's standard library only, picks the agent bundle built for the image's python3, downloads
     it with retries (AWS: URLs the launcher presigned; GCP: the GCS JSON API with the VM's own
     service-account token from the metadata server), checks its sha256 and unpacks it into /opt/jobplane
     (BUNDLE_MARKER there names it: an image baked with that very bundle, or a disk that booted before, skips
     the download);
  3. runs `python3 -m jobplane.agent` from there, which takes its settings from the JOBPLANE_* variables.
A failure before the agent runs prints one line "jobplane-bootstrap: FAILED: ..." (the cloud keeps it in
the VM's console output) and, where the network allows, writes it to the attempt's boot-failure object,
so the check fails the job with that reason instead of waiting out the boot timeout.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from jobplane.model.policy import Policy
from jobplane.model.spec import JobSpec

MAX_USER_DATA = 16 * 1024  # EC2's limit on user-data (before base64)
AGENT_HOME = "/opt/jobplane"
FAILED = "jobplane-bootstrap: FAILED:"
BUNDLE_MARKER = ".bundle-sha256"  # in the agent's home: the sha256 of the bundle unpacked there (INSTALL's name)


class Fetch(NamedTuple):
    """One agent bundle variant as the VM fetches it (a tuple: its JSON is its fields, by name)."""

    name: str
    url: str
    sha256: str


@dataclass(frozen=True)
class AgentSource:
    """Where a VM gets its agent: a bundle per Python version for its architecture, and where it reports a
    failed boot. auth "gce": the requests carry the VM service account's token (the URLs are not signed)."""

    bundles: Mapping[str, Fetch]
    report_url: str
    report_method: str = "PUT"
    auth: str | None = None
    vend_url: str | None = None  # where the agent asks for its job's storage credentials (None: its VM's own)

    def as_json(self) -> str:
        return json.dumps({"auth": self.auth, "report": {"url": self.report_url, "method": self.report_method},
                           "bundles": {py: f._asdict() for py, f in sorted(self.bundles.items())}},
                          separators=(",", ":"))


# Runs on the image's python3, whatever its version: so no syntax newer than Python 3.5, and every way
# it can fail ends in fail(), one console line and a best-effort report.
INSTALL = r"""
import hashlib, io, json, os, random, shutil, subprocess, sys, tarfile, time
from urllib.parse import quote
from urllib.request import Request, urlopen

cfg = json.loads(os.environ["JOBPLANE_BOOT"])
home = os.environ.get("JOBPLANE_AGENT_HOME") or "/opt/jobplane"

def say(msg):
    print("jobplane-bootstrap: " + msg)
    sys.stdout.flush()

def headers():
    if cfg.get("auth") != "gce":
        return {}
    host = os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    req = Request("http://%s/computeMetadata/v1/instance/service-accounts/default/token" % host,
                  headers={"Metadata-Flavor": "Google"})
    return {"Authorization": "Bearer " + json.loads(urlopen(req, timeout=10).read().decode())["access_token"]}

def job_headers():
    # on GCP the VM's own account may only read the agent bundles: a report goes with the job's own token,
    # which the vending function gives for the VM's identity token (as the agent's credentials)
    vend = os.environ.get("JOBPLANE_VEND_URL")
    if cfg.get("auth") != "gce" or not vend:
        return headers()
    host = os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    req = Request("http://%s/computeMetadata/v1/instance/service-accounts/default/identity?audience=%s&format=full"
                  % (host, quote(vend, safe="")), headers={"Metadata-Flavor": "Google"})
    identity = urlopen(req, timeout=10).read().decode()
    ask = json.dumps({"identity_token": identity, "job_id": os.environ["JOBPLANE_JOB_ID"],
                      "attempt": int(os.environ["JOBPLANE_ATTEMPT"])}).encode()
    req = Request(vend, data=ask, method="POST",
                  headers={"Content-Type": "application/json", "Authorization": "Bearer " + identity})
    return {"Authorization": "Bearer " + json.loads(urlopen(req, timeout=30).read().decode())["access_token"]}

def call(url, data=None, method="GET", tries=7, auth=headers):
    for n in range(tries):
        try:
            req = Request(url, data=data, headers=auth(), method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            return urlopen(req, timeout=120).read()
        except Exception as exc:
            code = getattr(exc, "code", None)
            if n == tries - 1 or (code is not None and 400 <= code < 500 and code not in (408, 429)):
                raise
            say("%s of %s failed (%s); retrying" % (method, url.split("?")[0], exc))
            time.sleep(min(30, 2 ** n) * random.uniform(0.5, 1))  # jittered: a fleet's VMs do not retry in step

def fail(msg):
    say("FAILED: " + msg)
    body = json.dumps({"version": 1, "message": msg[:4096], "python": sys.version.split()[0], "host": os.uname()[1],
                       "time": time.time()}).encode()  # jobplane.model.records.BootFailure
    try:
        call(cfg["report"]["url"], body, cfg["report"]["method"], tries=3, auth=job_headers)
    except Exception as exc:
        say("could not report the failure to the registry: %s" % exc)
    sys.exit(1)

version = "%d.%d" % sys.version_info[:2]
bundle = cfg["bundles"].get(version)
if bundle is None:
    fail("python3 on this image is %s; this deployment's agent runs on Python %s: use an image with one of "
         "them (e.g. image: ubuntu-24.04)" % (version, ", ".join(sorted(cfg["bundles"])) or "(none)"))
try:
    with open(os.path.join(home, ".bundle-sha256")) as f:
        there = f.read().strip()
except OSError:
    there = ""
if there == bundle["sha256"]:  # an image baked with this very bundle (or a disk that booted before)
    say("agent %s already in %s (same sha256): not downloaded" % (bundle["name"], home))
    sys.exit(0)
try:
    data = call(bundle["url"])
except Exception as exc:
    fail("cannot download the agent bundle %s: %s" % (bundle["name"], exc))
if hashlib.sha256(data).hexdigest() != bundle["sha256"]:
    fail("agent bundle %s: sha256 mismatch (%d bytes downloaded)" % (bundle["name"], len(data)))
staging = home + ".new"
shutil.rmtree(staging, ignore_errors=True)
try:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, filter="data")
        else:
            tar.extractall(staging)
    with open(os.path.join(staging, ".bundle-sha256"), "w") as f:
        f.write(bundle["sha256"])
    shutil.rmtree(home, ignore_errors=True)
    os.rename(staging, home)
except Exception as exc:
    fail("cannot unpack the agent bundle into %s: %s" % (home, exc))
probe = subprocess.run([sys.executable, "-c", "import jobplane.agent.cli"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=home + "/site"))
if probe.returncode != 0:
    fail("the agent does not import on Python %s: %s" % (version, probe.stdout.decode().strip().splitlines()[-1:]))
say("agent %s unpacked into %s" % (bundle["name"], home))
"""

_TEMPLATE = """#!/bin/bash
# jobplane bootstrap (generated): every value below is shell-quoted.
set -uo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export JOBPLANE_CLOUD={cloud}
export JOBPLANE_BUCKET={bucket}
export JOBPLANE_ROOT={root}
export JOBPLANE_REGION={region}
export JOBPLANE_JOB_ID={job_id}
export JOBPLANE_ATTEMPT={attempt}
export JOBPLANE_BOOT={boot}
export JOBPLANE_VEND_URL={vend}

# Uptime backstop: power off at the cap even if the agent or the control plane is gone.
shutdown -h +{minutes} "jobplane: uptime cap of {minutes} minutes" || true

if ! command -v python3 >/dev/null; then
  echo "{failed} no python3 on this image: the agent needs python3 (e.g. image: ubuntu-24.04)"
  exit 1
fi
python3 - <<'JOBPLANE_INSTALL' || exit 1
{install}
JOBPLANE_INSTALL

export PYTHONPATH="${{JOBPLANE_AGENT_HOME:-{home}}}/site"
exec python3 -m jobplane.agent
"""


def render(*, cloud: str, bucket: str, root: str, region: str | None, job_id: str, attempt: int,
           uptime_minutes: int, agent: AgentSource) -> str:
    """The startup script for one attempt of one job."""
    if cloud not in ("aws", "gcp"):
        raise ValueError(f"unknown cloud {cloud!r}")
    if uptime_minutes < 1:
        raise ValueError("uptime_minutes must be at least 1")
    return _TEMPLATE.format(
        cloud=shlex.quote(cloud),
        bucket=shlex.quote(bucket),
        root=shlex.quote(root.strip("/")),
        region=shlex.quote(region or ""),
        job_id=shlex.quote(job_id),
        attempt=int(attempt),
        boot=shlex.quote(agent.as_json()),
        vend=shlex.quote(agent.vend_url or ""),
        minutes=int(uptime_minutes),
        failed=FAILED,
        install=INSTALL.strip(),
        home=AGENT_HOME,
    )


def uptime_minutes(spec: JobSpec, policy: Policy) -> int:
    """The VM's lifetime (the uptime cap, plus a debug hold) in whole minutes, rounded up so the backstop never
    fires before the graceful path."""
    return max(1, math.ceil(policy.vm_lifetime(spec) / 60))


def render_for(spec: JobSpec, *, job_id: str, attempt: int, policy: Policy, bucket: str, root: str,
               region: str | None, agent: AgentSource) -> str:
    """The script for a job: the spec decides only the cloud and (through the policy) the uptime cap."""
    return render(cloud=spec.cloud, bucket=bucket, root=root, region=region, job_id=job_id, attempt=attempt,
                  uptime_minutes=uptime_minutes(spec, policy), agent=agent)
