"""The VM startup script: no spec text reaches it, every value is quoted, it fits EC2's 16 KB, and run on
this machine with python3 only (never the real shutdown) it schedules the backstop, fetches the real agent
bundle over HTTP from moto's S3 (presigned) or the GCS fake (VM token), checks it, unpacks it and starts
the agent from it; every way the install can fail ends in one console line and a report in the registry."""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobplane.boot import agent_bundle, bundling
from jobplane.boot.bootstrap import BUNDLE_MARKER, MAX_USER_DATA, AgentSource, Fetch, render, render_for, uptime_minutes
from jobplane.clouds.base import NotFound
from jobplane.clouds.s3 import S3Store, s3_client
from jobplane.control.steps import agent_source
from jobplane.local import cache_dir
from jobplane.local.baked_agent import bake, unpacked
from jobplane.model import keys
from jobplane.model.policy import DEFAULT_POLICY
from jobplane.model.records import BootFailure
from jobplane.model.spec import JobSpec
from jobplane.store.registry import Registry
from tests.helpers import find_python, run_bootstrap

SOURCE = AgentSource({"3.11": Fetch("aws-py3.11-x86_64.tar.gz", "https://b.s3.amazonaws.com/x?a=1&b=2", "0" * 64)},
                     "https://b.s3.amazonaws.com/r?a=1&b=2")

pytestmark = pytest.mark.timeout(120)

# Distinctive hostile text: a marker the script never contains, then shell metacharacters and payloads.
_PAYLOAD = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
_TAILS = st.sampled_from(["$(shutdown -h now)", "`reboot`", "'; halt; '", '"; poweroff #', "\n rm -rf / \n",
                          "${IFS}", "\\", "%s{x}"])
HOSTILE = st.builds(lambda p, t: f"HOSTILE{p}{t}", _PAYLOAD, _TAILS)
LABEL_VALUE = st.from_regex(r"hostile[a-z0-9_-]{1,20}", fullmatch=True)


def bash_syntax_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True).returncode == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=HOSTILE, setup=HOSTILE, run=HOSTILE, env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}",
       fullmatch=True), HOSTILE, max_size=3), image=HOSTILE, code=HOSTILE, uri=HOSTILE, ckpt=HOSTILE,
       label=LABEL_VALUE)
def test_hostile_spec_text_never_reaches_the_script(name: str, setup: str, run: str, env: dict[str, str],
                                                    image: str, code: str, uri: str, ckpt: str, label: str) -> None:
    raw: dict[str, Any] = {
        "id": "victim-job", "name": name[:128], "instance_type": "g5.xlarge", "setup": setup, "run": run,
        "env": env, "image": image[:512], "code": "s3://" + code, "inputs": {"train": {"uri": "s3://" + uri}},
        "checkpoint_dir": "/" + ckpt.replace("..", "_"), "artifacts_dir": "/" + ckpt.replace("..", "_") + "x",
        "labels": {"team": label}, "owner": "hostile_owner",
    }
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError:
        assume(False)
        raise
    script = render_for(spec, job_id="victim-job", attempt=3, policy=DEFAULT_POLICY, bucket="jobplane-bucket",
                        root="team/a", region="us-east-1", agent=SOURCE)
    assert bash_syntax_ok(script)
    free_text = [spec.name, spec.setup, spec.run, spec.image, spec.code, spec.inputs["train"].uri,
                 spec.checkpoint_dir, spec.artifacts_dir, *spec.env.values(), *spec.labels.values(), spec.owner]
    for value in free_text:
        assert value and value not in script
    assert "HOSTILE" not in script and "hostile_owner" not in script and "hostile" + label[7:] not in script


DANGEROUS = ("shutdown", "reboot", "halt", "poweroff", "rm")


@pytest.fixture(scope="module")
def trap_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shims that shadow every command the hostile payloads name, in case quoting ever broke."""
    bin_dir = tmp_path_factory.mktemp("trap") / "bin"
    bin_dir.mkdir()
    for name in DANGEROUS:
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} >> {bin_dir}/sprung\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bucket=HOSTILE, root=HOSTILE, region=HOSTILE, job_id=HOSTILE, url=HOSTILE)
def test_location_values_are_quoted(trap_bin: Path, bucket: str, root: str, region: str, job_id: str,
                                    url: str) -> None:
    """Even values that never come from users (bucket, root, URLs...) cannot break out of their quotes."""
    agent = AgentSource({"3.12": Fetch("n", url, "0" * 64)}, url, auth="gce", vend_url=url)
    script = render(cloud="aws", bucket=bucket, root=root, region=region, job_id=job_id, attempt=1,
                    uptime_minutes=60, agent=agent)
    assert bash_syntax_ok(script)
    # run only the assignments (everything before the backstop) and read the values back from bash
    assignments = script.split("# Uptime backstop")[0]
    names = ["JOBPLANE_BUCKET", "JOBPLANE_ROOT", "JOBPLANE_REGION", "JOBPLANE_JOB_ID", "JOBPLANE_BOOT",
             "JOBPLANE_VEND_URL"]
    probe = assignments + "printf '%s\\0' " + " ".join(f'"${n}"' for n in names) + "\n"
    out = subprocess.run(["bash", "-c", probe], env={"PATH": f"{trap_bin}:/usr/bin:/bin"}, capture_output=True,
                         timeout=10)
    assert out.returncode == 0, out.stderr
    assert not (trap_bin / "sprung").exists()
    assert out.stdout.decode().split("\0")[:6] == [bucket, root.strip("/"), region, job_id, agent.as_json(), url]




# ---- running the script on this machine -----------------------------------------------------------------
@functools.cache
def this_machines_bundle() -> tuple[Path, agent_bundle.Variant]:
    """This machine's real agent bundle (jobplane.boot.bundling builds it once per set of inputs, in the cache)."""
    return bundling.local_variant("aws", cache_dir())


@pytest.fixture
def registry(moto_endpoint: str) -> Registry:
    """A registry on moto's S3 server (HTTP: the script fetches presigned URLs) whose system/agent/ manifest names
    this machine's real agent bundle. The bundle itself (some 30 MB) is there only for the tests whose VMs download
    it (upload_bundle): a script that stops before the download never asks for it."""
    store = S3Store("boot-bucket", s3_client("us-east-1"))
    store.client.create_bucket(Bucket="boot-bucket")
    reg = Registry(store, "team")
    _, variant = this_machines_bundle()
    reg.store.put(reg.key(keys.agent_file(agent_bundle.MANIFEST)), agent_bundle.manifest([variant]))
    return reg


def upload_bundle(reg: Registry) -> None:
    path, variant = this_machines_bundle()
    reg.store.put(reg.key(keys.agent_file(variant.name)), path.read_bytes())


def script_for(reg: Registry, variants: list[agent_bundle.Variant] | None = None) -> str:
    found = variants or agent_bundle.parse_manifest(reg.get_bytes(keys.agent_file(agent_bundle.MANIFEST)))
    source = agent_source(reg, found, "aws", bundling.host_architecture(), "job-7", 2, expires=600)
    assert source is not None
    return render(cloud="aws", bucket="boot-bucket", root="team", region="us-east-1", job_id="job-7", attempt=2,
                  uptime_minutes=90, agent=source)


def test_the_script_fetches_checks_unpacks_and_starts_the_agent(registry: Registry, tmp_path: Path) -> None:
    upload_bundle(registry)
    done = run_bootstrap(script_for(registry), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    home = tmp_path / "opt-jobplane"
    assert (tmp_path / "power.log").read_text().splitlines() == ["shutdown -h +90 jobplane: uptime cap of 90 minutes"]
    assert f"agent aws-py3.11-x86_64.tar.gz unpacked into {home}" in done.stdout
    assert f"agent import: {home}/site/jobplane/__init__.py job-7" in done.stdout
    assert (home / "site" / "bin" / "uv").stat().st_mode & 0o111
    with pytest.raises(NotFound):
        registry.get_bytes(keys.boot_failure("job-7", 2))


def test_a_home_that_holds_this_bundle_boots_without_downloading_it(registry: Registry, tmp_path: Path) -> None:
    """A disk that booted before, or an image baked with the bundle (`local up --baked-agent` makes its VMs' homes
    so): the marker names the bundle's sha256 and the bootstrap goes straight to the agent, even with the bundle
    gone from the registry; a home of another bundle is replaced by a download."""
    upload_bundle(registry)
    assert run_bootstrap(script_for(registry), tmp_path / "disk").returncode == 0  # unpacks, and marks the home
    (variant,) = agent_bundle.parse_manifest(registry.get_bytes(keys.agent_file(agent_bundle.MANIFEST)))
    path, _ = this_machines_bundle()
    bake(unpacked(path, variant.sha256, cache_dir()), tmp_path / "image" / "opt-jobplane")
    registry.delete(keys.agent_file(variant.name))  # a download now fails
    for vm in ("disk", "image"):
        done = run_bootstrap(script_for(registry), tmp_path / vm)
        assert done.returncode == 0, done.stdout + done.stderr
        home = tmp_path / vm / "opt-jobplane"
        assert f"agent {variant.name} already in {home} (same sha256): not downloaded" in done.stdout
        assert f"agent import: {home}/site/jobplane/__init__.py job-7" in done.stdout
    (tmp_path / "disk" / "opt-jobplane" / BUNDLE_MARKER).write_text("0" * 64)  # an older bundle's home
    stale = run_bootstrap(script_for(registry), tmp_path / "disk")
    assert stale.returncode == 1 and f"cannot download the agent bundle {variant.name}" in stale.stdout


def _no_bundle_for_this_python(reg: Registry, v: agent_bundle.Variant) -> tuple[list[agent_bundle.Variant], str]:
    return [replace(v, python="3.99")], "python3 on this image is 3.11; this deployment's agent runs on Python 3.99"


def _unreadable(reg: Registry, v: agent_bundle.Variant) -> tuple[list[agent_bundle.Variant], str]:
    reg.delete(keys.agent_file(v.name))  # the manifest names it; the bucket has it not
    return [v], f"cannot download the agent bundle {v.name}: HTTP Error 404"


def _tampered(reg: Registry, v: agent_bundle.Variant) -> tuple[list[agent_bundle.Variant], str]:
    upload_bundle(reg)  # downloaded whole, then refused
    return [replace(v, sha256="f" * 64)], f"agent bundle {v.name}: sha256 mismatch ({v.size} bytes downloaded)"


@pytest.mark.parametrize("breakage", [_no_bundle_for_this_python, _unreadable, _tampered])
def test_a_failed_install_says_why_on_the_console_and_in_the_registry(
        registry: Registry, tmp_path: Path, breakage: Any) -> None:
    (variant,) = agent_bundle.parse_manifest(registry.get_bytes(keys.agent_file(agent_bundle.MANIFEST)))
    variants, why = breakage(registry, variant)
    done = run_bootstrap(script_for(registry, variants), tmp_path)
    assert done.returncode == 1
    assert f"jobplane-bootstrap: FAILED: {why}" in done.stdout
    assert "agent import:" not in done.stdout  # the agent never ran
    # the bootstrap's standard-library writer and the sweeper's model agree, field for field
    written = registry.get_bytes(keys.boot_failure("job-7", 2))
    assert set(json.loads(written)) == set(BootFailure.model_fields)
    report = BootFailure.parse(written)
    assert why in report.message and report.python is not None and report.python.startswith("3.11")


@pytest.mark.parametrize("version", ["3.6", "3.9", "3.10"])
def test_an_image_with_an_older_python3_fails_at_boot_saying_so(registry: Registry, tmp_path: Path,
                                                                version: str) -> None:
    """The install step itself runs on any python3 (no newer syntax), so even Python 3.6 gets the message."""
    python = find_python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    done = run_bootstrap(script_for(registry), tmp_path, python=python)
    assert done.returncode == 1, done.stdout + done.stderr
    why = f"python3 on this image is {version}; this deployment's agent runs on Python 3.11"
    assert f"jobplane-bootstrap: FAILED: {why}: use an image with one of them (e.g. image: ubuntu-24.04)" in done.stdout
    assert registry.get_json(keys.boot_failure("job-7", 2))["python"].startswith(version)


def test_user_data_fits_ec2s_16_kb_with_long_credentials_and_every_python(moto_endpoint: str) -> None:
    """Presigned URLs carry the Lambda role's session token (~1 KB): three Pythons' bundles plus the report."""
    client = boto3.client("s3", region_name="ap-southeast-2", aws_access_key_id="ASIA" + "X" * 16,
                          aws_secret_access_key="s" * 40, aws_session_token="t" * 1200,
                          config=Config(signature_version="s3v4"))
    reg = Registry(S3Store("b" * 63, client), "a-long/registry-root")
    variants = [agent_bundle.Variant("aws", py, "aarch64", "0" * 64, 1) for py in ("3.11", "3.12", "3.13")]
    source = agent_source(reg, variants, "aws", "aarch64", "j" * 63, 100, expires=3600)
    assert source is not None
    script = render(cloud="aws", bucket="b" * 63, root="a-long/registry-root", region="ap-southeast-2",
                    job_id="j" * 63, attempt=100, uptime_minutes=10080, agent=source)
    assert bash_syntax_ok(script)
    assert len(script.encode()) < MAX_USER_DATA, len(script.encode())


def test_the_vms_are_told_where_to_ask_for_their_jobs_credentials(registry: Registry) -> None:
    """The deployment's vending function (Settings.vend_url) reaches the agent through the script."""
    vending = Registry(registry.store, "team", vend_url="http://127.0.0.1:9/vend")
    assert "\nexport JOBPLANE_VEND_URL=http://127.0.0.1:9/vend\n" in script_for(vending)
    assert "\nexport JOBPLANE_VEND_URL=''\n" in script_for(registry)  # none: the VM's own identity


def test_a_debug_hold_extends_the_vms_own_backstop_by_the_hold() -> None:
    spec = JobSpec(instance_type="t3.micro", run="python3 train.py", max_runtime="2h", debug_hold="30m")
    assert DEFAULT_POLICY.vm_lifetime(spec) == 9000 and uptime_minutes(spec, DEFAULT_POLICY) == 150
    script = render_for(spec, job_id="held", attempt=1, policy=DEFAULT_POLICY, bucket="jobplane-bucket", root="",
                        region="us-east-1", agent=SOURCE)
    assert 'shutdown -h +150 "jobplane: uptime cap of 150 minutes"' in script
    assert uptime_minutes(spec.model_copy(update={"debug_hold": None}), DEFAULT_POLICY) == 120
