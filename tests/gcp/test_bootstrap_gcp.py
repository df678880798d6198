"""The startup script on GCE: no signed URLs; the VM reads the agent bundle and reports a failed boot through
the GCS JSON API with its service account's token from the metadata server (here the GCS fake and the fake
metadata server), using python3's standard library only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jobplane.boot import bundling
from jobplane.boot.bootstrap import render
from jobplane.control.steps import agent_source
from jobplane.local import cache_dir
from jobplane.model import keys
from tests.gcp.conftest import BUCKET, GcpCloud
from tests.gcp.fakes import MetadataFake
from tests.helpers import run_bootstrap

pytestmark = pytest.mark.timeout(180)


def test_a_gce_vm_fetches_the_agent_with_its_own_token_and_reports_a_failed_boot(
        cloud: GcpCloud, tmp_path: Path) -> None:
    reg = cloud.registry
    path, variant = bundling.local_variant("gcp", cache_dir())
    reg.store.put(reg.key(keys.agent_file(variant.name)), path.read_bytes())
    arch = bundling.host_architecture()

    def script(job_id: str, sha256: str) -> str:
        source = agent_source(reg, [replace(variant, sha256=sha256)], "gcp", arch, job_id, 1, expires=600)
        assert source is not None and source.auth == "gce"
        return render(cloud="gcp", bucket=BUCKET, root="reg", region="us-central1", job_id=job_id, attempt=1,
                      uptime_minutes=60, agent=source)

    with MetadataFake() as metadata:
        good = run_bootstrap(script("gce-ok", variant.sha256), tmp_path / "ok", GCE_METADATA_HOST=metadata.host)
        assert metadata.requests >= 1  # the token came from the metadata server
        bad = run_bootstrap(script("gce-bad", "0" * 64), tmp_path / "bad", GCE_METADATA_HOST=metadata.host)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"agent import: {tmp_path}/ok/opt-jobplane/site/jobplane/__init__.py gce-ok" in good.stdout
    assert bad.returncode == 1
    why = f"agent bundle {variant.name}: sha256 mismatch ({variant.size} bytes downloaded)"
    assert f"jobplane-bootstrap: FAILED: {why}" in bad.stdout
    assert reg.get_json(keys.boot_failure("gce-bad", 1))["message"] == why
