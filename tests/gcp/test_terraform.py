"""infra/gcp: the Terraform parses (python-hcl2), holds every resource its README promises with the
settings promised, grants nothing public, and the function package imports from its own zip."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import hcl2
import pytest

from jobplane import images

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).parents[2]
INFRA = REPO / "infra" / "gcp"


def _clean(value: Any) -> Any:
    """python-hcl2 keeps string quotes and marks blocks; strip both so the tests read plain values."""
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _parse() -> dict[str, dict[str, Any]]:
    """Every block of every .tf file: {"resource": {"type.name": body}, "variable": {...}, ...}."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(INFRA.glob("*.tf")):
        with path.open() as f:
            doc = _clean(hcl2.load(f))
        for kind in ("resource", "data"):
            for entry in doc.get(kind, []):
                for rtype, named in entry.items():
                    for name, body in named.items():
                        out.setdefault(kind, {})[f"{rtype}.{name}"] = body
        for kind in ("variable", "output"):
            for entry in doc.get(kind, []):
                out.setdefault(kind, {}).update(entry)
    return out


@pytest.fixture(scope="module")
def tf() -> dict[str, dict[str, Any]]:
    return _parse()


def block(body: dict[str, Any], name: str) -> dict[str, Any]:
    [inner] = body[name]
    return dict(inner)


def test_every_resource_the_readme_promises_exists(tf: dict[str, dict[str, Any]]) -> None:
    promised = set(re.findall(r"`(google_[a-z0-9_]+\.[a-z0-9_]+)`", (INFRA / "README.md").read_text()))
    assert len(promised) >= 25
    assert promised <= set(tf["resource"]), promised - set(tf["resource"])
    assert set(tf["resource"]) <= promised | {"google_storage_bucket_object.policy"}, "README omits some"


def test_registry_bucket_is_versioned_uniform_and_never_public(tf: dict[str, dict[str, Any]]) -> None:
    for name in ("google_storage_bucket.registry", "google_storage_bucket.sources"):
        bucket = tf["resource"][name]
        assert bucket["uniform_bucket_level_access"] is True
        assert bucket["public_access_prevention"] == "enforced"
    assert block(tf["resource"]["google_storage_bucket.registry"], "versioning")["enabled"] is True
    members = [b["member"] for b in tf["resource"].values() if "member" in b]
    assert members and not [m for m in members if "allUsers" in m or "allAuthenticatedUsers" in m]


def test_launcher_is_triggered_by_finalized_objects_of_the_registry(tf: dict[str, dict[str, Any]]) -> None:
    fn = tf["resource"]["google_cloudfunctions2_function.launcher"]
    trigger = block(fn, "event_trigger")
    assert trigger["event_type"] == "google.cloud.storage.object.v1.finalized"
    assert block(trigger, "event_filters") == {"attribute": "bucket",
                                               "value": "${google_storage_bucket.registry.name}"}
    assert block(fn, "build_config")["entry_point"] == "launcher"


def test_http_functions_are_scheduled_with_oidc(tf: dict[str, dict[str, Any]]) -> None:
    main_py = (REPO / "functions" / "gcp" / "main.py").read_text()
    http = tf["resource"]["google_cloudfunctions2_function.http"]
    assert block(http, "build_config")["entry_point"] == "${each.key}"
    schedules = tf["variable"]["schedules"]["default"]
    assert set(schedules) == {"launcher_backstop", "sweeper", "rerun", "uptime_cap"}
    for entry_point in schedules:
        assert f"def {entry_point}(request: flask.Request)" in main_py
    job = tf["resource"]["google_cloud_scheduler_job.http"]
    oidc = block(block(job, "http_target"), "oidc_token")
    assert oidc["service_account_email"] == "${google_service_account.scheduler.email}"


def test_roles_are_the_least_each_identity_needs(tf: dict[str, dict[str, Any]]) -> None:
    grants = {(b["member"], b["role"]) for b in tf["resource"].values() if "role" in b}

    def roles(who: str) -> set[str]:
        return {role for member, role in grants if member == f"${{google_service_account.{who}.member}}"}
    assert roles("functions") == {"roles/storage.objectUser", "roles/compute.instanceAdmin.v1",
                                  "roles/iam.serviceAccountUser", "roles/eventarc.eventReceiver",
                                  "roles/run.invoker"}
    assert roles("vms") == {"roles/storage.objectUser", "roles/logging.logWriter"}
    assert roles("scheduler") == {"roles/run.invoker"}
    assert roles("builder") == {"roles/storage.objectViewer", "${each.value}"}
    assert tf["resource"]["google_project_iam_member.builder"]["for_each"] == \
        '${toset(["roles/artifactregistry.writer", "roles/logging.logWriter"])}'
    for fn in ("google_cloudfunctions2_function.launcher", "google_cloudfunctions2_function.http"):
        assert block(tf["resource"][fn], "build_config")["service_account"] == "${google_service_account.builder.id}"
    act_as = tf["resource"]["google_service_account_iam_member.functions_act_as_vms"]
    assert act_as["service_account_id"] == "${google_service_account.vms.name}"  # not project-wide


def test_outputs_and_terraform_fmt(tf: dict[str, dict[str, Any]]) -> None:
    assert {"bucket", "queue_uri", "function_uris"} <= set(tf["output"])
    if shutil.which("terraform") is None:
        pytest.skip("terraform not installed: HCL parsed, fmt not checked")
    fmt = subprocess.run(["terraform", "fmt", "-check", "-diff", str(INFRA)], capture_output=True, text=True,
                         timeout=60)
    assert fmt.returncode == 0, fmt.stdout


def test_the_function_zip_imports_from_itself_without_aws(tmp_path: Path) -> None:
    subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "gcp-functions-zip"], cwd=REPO,
                   check=True, capture_output=True, timeout=120)
    with zipfile.ZipFile(REPO / "build" / "gcp-functions.zip") as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path)
    assert {"main.py", "requirements.txt", "jobplane/__init__.py", "jobplane/clouds/gcp.py"} <= names
    assert not [n for n in names if "__pycache__" in n]
    code = ("import sys, main, jobplane; assert jobplane.__file__.startswith(sys.argv[1]), jobplane.__file__; "
            "assert not [m for m in sys.modules if m.startswith(('boto3', 'botocore'))]")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, check=True, timeout=120)
    requirements = (tmp_path / "requirements.txt").read_text()
    assert "google-cloud-compute" in requirements and "boto3" not in requirements


def test_agent_bundles_are_uploaded_and_new_policies_boot_the_image_aliases(tf: dict[str, dict[str, Any]]) -> None:
    agent = tf["resource"]["google_storage_bucket_object.agent"]
    assert agent["for_each"] == '${fileset(var.agent_dir, "*")}'
    assert agent["name"] == "${local.prefix}system/agent/${each.value}"
    assert tf["variable"]["agent_dir"]["default"] == "../../build/agent"  # where `make gcp-package` puts them
    policy = tf["resource"]["google_storage_bucket_object.policy"]["content"]
    assert "var.default_image" in policy and "var.default_gpu_image" in policy
    assert (tf["variable"]["default_image"]["default"], tf["variable"]["default_gpu_image"]["default"]) == (
        images.DEFAULT_CPU, images.DEFAULT_GPU)
    makefile = (REPO / "Makefile").read_text()
    assert "-m jobplane.bundling --cloud gcp --out build/agent" in makefile
