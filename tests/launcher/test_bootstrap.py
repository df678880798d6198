"""The VM startup script: no spec text reaches it, every value is quoted, and run with PATH shims
(never the real shutdown) it schedules the backstop, installs the agent when needed, and starts it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobplane.bootstrap import render, render_for
from jobplane.policy import DEFAULT_POLICY
from jobplane.spec import JobSpec

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
                        root="team/a", region="us-east-1")
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
@given(bucket=HOSTILE, root=HOSTILE, region=HOSTILE, job_id=HOSTILE)
def test_location_values_are_quoted(trap_bin: Path, bucket: str, root: str, region: str, job_id: str) -> None:
    """Even values that never come from users (bucket, root...) cannot break out of their quotes."""
    script = render(cloud="aws", bucket=bucket, root=root, region=region, job_id=job_id, attempt=1,
                    uptime_minutes=60)
    assert bash_syntax_ok(script)
    # run only the assignments (everything before the backstop) and read the values back from bash
    assignments = script.split("# Uptime backstop")[0]
    names = ["JOBPLANE_BUCKET", "JOBPLANE_ROOT", "JOBPLANE_REGION", "JOBPLANE_JOB_ID"]
    probe = assignments + "printf '%s\\0' " + " ".join(f'"${n}"' for n in names) + "\n"
    out = subprocess.run(["bash", "-c", probe], env={"PATH": f"{trap_bin}:/usr/bin:/bin"}, capture_output=True,
                         timeout=10)
    assert out.returncode == 0, out.stderr
    assert not (trap_bin / "sprung").exists()
    assert out.stdout.decode().split("\0")[:4] == [bucket, root.strip("/"), region, job_id]


# ---- running the script against shims ---------------------------------------------------------------------
SHIM = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$SHIM_LOG"
{extra}
"""
PYTHON_SHIM = """
if [ "$1" = "-c" ]; then exit "$SHIM_IMPORTABLE"; fi
if [ "$1 $2" = "-m jobplane.agent" ]; then env | grep '^JOBPLANE_' | sort >> "$SHIM_LOG"; fi
exit 0
"""
AWS_SHIM = 'for a in "$@"; do last="$a"; done; touch "$last/jobplane-0.1.0-py3-none-any.whl"'


def shims(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, extra in {"shutdown": "", "python3": PYTHON_SHIM, "aws": AWS_SHIM, "gcloud": AWS_SHIM}.items():
        path = bin_dir / name
        path.write_text(SHIM.format(extra=extra))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SHIM_LOG": str(tmp_path / "calls.log"), "HOME": str(tmp_path)}
    # safety: the script must find our shutdown, never the machine's
    assert shutil.which("shutdown", path=env["PATH"]) == str(bin_dir / "shutdown")
    return env


@pytest.mark.parametrize("cloud,importable", [("aws", True), ("aws", False), ("gcp", False)])
def test_script_runs_backstop_install_and_agent(tmp_path: Path, cloud: str, importable: bool) -> None:
    env = shims(tmp_path)
    env["SHIM_IMPORTABLE"] = "0" if importable else "1"
    script = render(cloud=cloud, bucket="my-bucket", root="/team/", region="eu-west-1", job_id="job-7",
                    attempt=2, uptime_minutes=90)

    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    calls = Path(env["SHIM_LOG"]).read_text().splitlines()
    assert calls[0] == "shutdown -h +90 jobplane: uptime cap of 90 minutes"
    installs = [c for c in calls if c.startswith(("aws", "gcloud", "python3 -m pip"))]
    if importable:
        assert installs == []
    else:
        scheme = {"aws": "s3", "gcp": "gs"}[cloud]
        assert f"{scheme}://my-bucket/team/system/wheels/" in installs[0]
        assert installs[1].startswith("python3 -m pip install --quiet --no-index --find-links ")
        assert installs[1].endswith(f"jobplane[{cloud}]")
    assert calls[-7:] == ["python3 -m jobplane.agent", "JOBPLANE_ATTEMPT=2", "JOBPLANE_BUCKET=my-bucket",
                          f"JOBPLANE_CLOUD={cloud}", "JOBPLANE_JOB_ID=job-7", "JOBPLANE_REGION=eu-west-1",
                          "JOBPLANE_ROOT=team"]
    assert os.environ.get("SHIM_LOG") is None  # nothing leaked into the test process
