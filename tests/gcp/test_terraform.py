"""infra/gcp: the Terraform parses (python-hcl2), holds every resource docs/deploy-gcp.md promises with the
settings promised, grants nothing public and no Compute Engine permission the adapter does not use, and
the function package imports from its own zip."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hcl2
import pytest

from jobplane.clouds.base import LaunchRequest
from jobplane.clouds.gcp import GceCompute, deployment_prefix
from jobplane.local import fake_sts, gce_permissions, gcp_grants, module_iam
from jobplane.model import images, keys
from tests.gcp.fakes import ComputeFake
from tests.helpers import foreign_sdk_imports, unwanted

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).parents[2]
INFRA = REPO / "infra" / "gcp"


_clean = module_iam.clean  # python-hcl2 keeps string quotes and marks blocks: the tests read plain values


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
        for kind in ("variable", "output", "locals"):
            for entry in doc.get(kind, []):
                out.setdefault(kind, {}).update(entry)
    return out


@pytest.fixture(scope="module")
def tf() -> dict[str, dict[str, Any]]:
    return _parse()


def block(body: dict[str, Any], name: str) -> dict[str, Any]:
    [inner] = body[name]
    return dict(inner)


def test_every_resource_the_deploy_page_promises_exists(tf: dict[str, dict[str, Any]]) -> None:
    page = REPO / "docs" / "deploy-gcp.md"
    promised = set(re.findall(r"`(google_[a-z0-9_]+\.[a-z0-9_]+)`", page.read_text()))
    assert len(promised) >= 25
    assert promised <= set(tf["resource"]), promised - set(tf["resource"])
    assert set(tf["resource"]) <= promised | {"google_storage_bucket_object.policy"}, f"{page.name} omits some"


def test_registry_bucket_is_versioned_uniform_and_never_public(tf: dict[str, dict[str, Any]]) -> None:
    for name in ("google_storage_bucket.registry", "google_storage_bucket.sources"):
        bucket = tf["resource"][name]
        assert bucket["uniform_bucket_level_access"] is True
        assert bucket["public_access_prevention"] == "enforced"
    assert block(tf["resource"]["google_storage_bucket.registry"], "versioning")["enabled"] is True
    members = [b["member"] for b in tf["resource"].values() if "member" in b]
    assert members and not [m for m in members if "allUsers" in m or "allAuthenticatedUsers" in m]


def test_registry_and_sources_log_every_request_to_a_versioned_log_bucket_kept_a_year(
        tf: dict[str, dict[str, Any]]) -> None:
    logs = tf["resource"]["google_storage_bucket.access_logs"]
    for name, prefix in (("registry", "registry"), ("sources", "sources")):
        bucket = tf["resource"][f"google_storage_bucket.{name}"]
        assert block(bucket, "logging") == {"log_bucket": "${google_storage_bucket.access_logs.name}",
                                            "log_object_prefix": prefix}
        assert block(bucket, "versioning")["enabled"] is True
    assert "logging" not in logs  # its own requests: that would loop
    assert block(logs, "versioning")["enabled"] is True
    assert logs["uniform_bucket_level_access"] is True and logs["public_access_prevention"] == "enforced"
    conditions = [block(rule, "condition") for rule in logs["lifecycle_rule"]]
    assert conditions == [{"age": 365}, {"days_since_noncurrent_time": 30}]
    writer = tf["resource"]["google_storage_bucket_iam_member.access_logs_writer"]
    assert (writer["role"], writer["member"]) == ("roles/storage.objectCreator",
                                                  "group:cloud-storage-analytics@google.com")


def test_every_function_takes_requests_from_inside_the_project_only(tf: dict[str, dict[str, Any]]) -> None:
    """Eventarc, Cloud Scheduler and the job VMs (through Private Google Access) are internal callers."""
    functions = {k: v for k, v in tf["resource"].items() if k.startswith("google_cloudfunctions2_function.")}
    assert set(functions) == {f"google_cloudfunctions2_function.{n}" for n in ("launcher", "http", "vend")}
    for name, fn in functions.items():
        assert block(fn, "service_config")["ingress_settings"] == "ALLOW_INTERNAL_ONLY", name
    assert tf["resource"]["google_compute_subnetwork.jobs"]["private_ip_google_access"] is True


def test_the_job_subnet_logs_every_flow(tf: dict[str, dict[str, Any]]) -> None:
    flows = block(tf["resource"]["google_compute_subnetwork.jobs"], "log_config")
    assert flows == {"aggregation_interval": "INTERVAL_5_MIN", "flow_sampling": 1.0,
                     "metadata": "INCLUDE_ALL_METADATA"}


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
    assert roles("functions") == {"roles/storage.objectUser", "roles/iam.serviceAccountUser",
                                  "${google_project_iam_custom_role.functions_compute.name}",
                                  "${google_project_iam_custom_role.functions_own_vms.name}",
                                  "roles/eventarc.eventReceiver", "roles/run.invoker", "roles/pubsub.publisher",
                                  "roles/secretmanager.secretAccessor"}  # this deployment's secrets, for vend
    secrets = tf["resource"]["google_project_iam_member.functions_secrets"]["condition"]
    assert "resource.name.startsWith('${local.secrets_prefix}')" in str(secrets)
    member = tf["resource"]["google_project_iam_custom_role.submitters_secrets"]["permissions"]
    assert not [p for p in member if "access" in p]  # a team member never reads a value
    assert not [role for _, role in grants if role.startswith("roles/compute.")]  # no predefined Compute role
    assert roles("vms") == {"roles/logging.logWriter", "roles/storage.objectViewer", "roles/run.invoker",
                            "roles/artifactregistry.reader"}  # on the container_repositories listed only
    assert roles("scheduler") == {"roles/run.invoker"}
    assert roles("builder") == {"roles/storage.objectViewer", "${each.value}"}
    assert tf["resource"]["google_project_iam_member.builder"]["for_each"] == \
        '${toset(["roles/artifactregistry.writer", "roles/logging.logWriter"])}'
    for fn in ("google_cloudfunctions2_function.launcher", "google_cloudfunctions2_function.http"):
        assert block(tf["resource"][fn], "build_config")["service_account"] == "${google_service_account.builder.id}"
    act_as = tf["resource"]["google_service_account_iam_member.functions_act_as_vms"]
    assert act_as["service_account_id"] == "${google_service_account.vms.name}"  # not project-wide


def test_outputs_and_terraform_fmt(tf: dict[str, dict[str, Any]]) -> None:
    assert {"bucket", "registry", "queue_uri", "function_uris"} <= set(tf["output"])
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
    assert unwanted(sorted(names), "gcp") == []  # no AWS adapter, local cloud, fake or CLI
    sources = {n: (tmp_path / n).read_text() for n in names if n.endswith(".py")}
    assert foreign_sdk_imports(sources, "gcp") == []
    code = ("import sys, main, jobplane; assert jobplane.__file__.startswith(sys.argv[1]), jobplane.__file__; "
            "assert not [m for m in sys.modules if m.startswith(('boto3', 'botocore'))]")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, check=True, timeout=120)
    requirements = (tmp_path / "requirements.txt").read_text()
    assert "google-cloud-compute" in requirements and "boto3" not in requirements
    assert "optuna" in requirements  # a bayesian sweep's proposals, in the sweeper


# ---- Compute Engine: the custom roles hold exactly what the adapter's API calls need --------------------
# What GCE checks for each call GceCompute makes and each field a create request sets: the table the local cloud's
# Compute fake enforces the functions' token with (jobplane.local.gce_permissions)
gp = gce_permissions
CALL_PERMISSIONS, VM_FIELDS, DISK_FIELDS = gp.CALL_PERMISSIONS, gp.VM_FIELDS, gp.DISK_FIELDS
NEW_DISK_FIELDS, NIC_FIELDS, CHANGES_A_VM = gp.NEW_DISK_FIELDS, gp.NIC_FIELDS, gp.CHANGES_A_VM
SERVER_FIELDS = frozenset({"kind", "id", "status", "zone", "creationTimestamp", "selfLink"})  # added by the fake
NIC_SERVER_FIELDS = frozenset({"name", "networkIP"})


def _fields(found: dict[str, Any], table: Mapping[str, frozenset[str]],
            ignore: frozenset[str] = frozenset()) -> set[str]:
    unknown = set(found) - set(table) - ignore
    assert not unknown, f"map these request fields to the permissions they need: {unknown}"
    return set().union(*(table[name] for name in found if name in table))


def _role(tf: dict[str, dict[str, Any]], name: str) -> set[str]:
    return set(tf["resource"][f"google_project_iam_custom_role.{name}"]["permissions"])


def test_the_custom_roles_hold_exactly_the_permissions_of_every_call_the_adapter_makes(
        tf: dict[str, dict[str, Any]], gce: GceCompute, compute_fake: ComputeFake) -> None:
    public = {name for name, _ in inspect.getmembers(GceCompute, inspect.isfunction) if not name.startswith("_")}
    assert public == {"launch", "list_managed", "attempt_instances", "terminate", "preempted",
                      "console_output", "find"}, \
        "a new adapter method: exercise it below"

    def request(zone: str | None, nodes: int) -> LaunchRequest:
        return LaunchRequest(job_id=f"perm-{nodes}-{zone or 'region'}", attempt=1, num_nodes=nodes,
                             instance_type="n2-standard-4", zone=zone, image="", spot=True, user_data="#!/bin/bash\n",
                             max_runtime=3600, disk_gb=50, owner="alice", labels=(("team", "vision"),))
    launched = [i.id for r in (request("us-central1-a", 1), request("us-central1-b", 2), request(None, 2))
                for i in gce.launch(r)]
    created = compute_fake.instances()  # what the three kinds of launch asked for
    gce.list_managed()
    compute_fake.preempt(launched[0])
    gce.preempted(since=datetime(2020, 1, 1, tzinfo=UTC))
    gce.console_output(launched[1])
    assert gce.find(launched[1]) is not None and gce.find("us-central1-a/no-such-vm") is None  # the vend lookup
    gce.terminate(launched[1:])

    assert set(compute_fake.calls) == set(CALL_PERMISSIONS), "map every call (and make every mapped one)"
    needed = set().union(*CALL_PERMISSIONS.values())
    for vm in created:
        needed |= _fields(vm, VM_FIELDS, SERVER_FIELDS)
        for disk in vm["disks"]:
            needed |= _fields(disk, DISK_FIELDS) | _fields(disk["initializeParams"], NEW_DISK_FIELDS)
        for nic in vm["networkInterfaces"]:
            needed |= _fields(nic, NIC_FIELDS, NIC_SERVER_FIELDS)

    launch_and_read, own_vms = _role(tf, "functions_compute"), _role(tf, "functions_own_vms")
    assert launch_and_read | own_vms == needed  # nothing missing, nothing extra
    assert own_vms == CHANGES_A_VM and not launch_and_read & CHANGES_A_VM


def test_changing_or_deleting_a_vm_is_granted_on_jobplane_vms_only(tf: dict[str, dict[str, Any]]) -> None:
    # what GceCompute names every VM of the deployment: jobplane-<6 hex of sha256(bucket[/root])>-
    assert tf["locals"]["deployment"] == '${local.root != "" ? "${local.bucket}/${local.root}" : local.bucket}'
    assert tf["locals"]["vm_name_prefix"] == "jobplane-${substr(sha256(local.deployment), 0, 6)}-"
    assert deployment_prefix("b/reg") == f"jobplane-{hashlib.sha256(b'b/reg').hexdigest()[:6]}-"
    plain = tf["resource"]["google_project_iam_member.functions_compute"]
    assert plain["role"] == "${google_project_iam_custom_role.functions_compute.name}" and "condition" not in plain
    guarded = tf["resource"]["google_project_iam_member.functions_own_vms"]
    assert guarded["role"] == "${google_project_iam_custom_role.functions_own_vms.name}"
    assert guarded["member"] == "${google_service_account.functions.member}"
    assert block(guarded, "condition")["expression"] == (
        "resource.type != 'compute.googleapis.com/Instance' || "
        "resource.name.extract('/instances/{name}').startsWith('${local.vm_name_prefix}')")


def test_the_local_gcp_cloud_holds_its_functions_to_exactly_the_modules_grants(tf: dict[str, dict[str, Any]]) -> None:
    """What jobplane.local.module_iam reads for the GCS and Compute fakes to enforce is the module's."""
    grants = module_iam.read_module()
    assert (grants.compute, grants.own_vms) == (_role(tf, "functions_compute"), _role(tf, "functions_own_vms"))
    registry = tf["resource"]["google_storage_bucket_iam_member.functions_registry"]
    assert grants.registry_role == registry["role"] == "roles/storage.objectUser" and grants.act_as_vms
    guarded = tf["resource"]["google_project_iam_member.functions_own_vms"]
    assert block(guarded, "condition")["expression"] == module_iam.CONDITION
    assert module_iam.FunctionGrants.from_export(grants.export()) == grants


def test_vms_may_read_the_data_buckets_listed_and_only_read(tf: dict[str, dict[str, Any]]) -> None:
    variable = tf["variable"]["data_buckets"]
    assert variable["type"] == "${list(string)}" and variable["default"] == []
    data = tf["resource"]["google_storage_bucket_iam_member.vms_data"]
    assert data["for_each"] == "${toset(var.data_buckets)}" and data["bucket"] == "${each.value}"
    assert (data["role"], data["member"]) == ("roles/storage.objectViewer", "${google_service_account.vms.member}")
    [pattern] = re.findall(r'regex\("([^"]+)"', block(variable, "validation")["condition"])
    assert [bool(re.fullmatch(pattern, name)) for name in
            ("my-datasets", "corp.data.bucket", "gs://my-datasets", "my-datasets/train")] == [True, True, False, False]


def test_vms_may_pull_containers_from_the_repositories_listed_only(tf: dict[str, dict[str, Any]]) -> None:
    variable = tf["variable"]["container_repositories"]
    assert variable["type"] == "${list(string)}" and variable["default"] == []
    pull = tf["resource"]["google_artifact_registry_repository_iam_member.vms_containers"]
    assert pull["for_each"] == "${toset(var.container_repositories)}"
    assert (pull["role"], pull["member"]) == ("roles/artifactregistry.reader", "${google_service_account.vms.member}")
    [pattern] = re.findall(r'regex\("([^"]+)"', block(variable, "validation")["condition"])
    assert [bool(re.fullmatch(pattern, name)) for name in
            ("us-central1/training", "europe/ml-images", "us-central1-docker.pkg.dev/p/r", "training")] == \
        [True, True, False, False]


def test_no_inbound_rule_but_between_the_vms_and_iaps_range_when_ssh_is_asked_for(
        tf: dict[str, dict[str, Any]]) -> None:
    from jobplane.sdk.shell import IAP_RANGE

    rules = {k: v for k, v in tf["resource"].items() if k.startswith("google_compute_firewall.")}
    assert set(rules) == {"google_compute_firewall.jobs_internal", "google_compute_firewall.iap_ssh"}
    internal = rules["google_compute_firewall.jobs_internal"]
    assert internal["source_service_accounts"] == ["${google_service_account.vms.email}"]
    assert "source_ranges" not in internal
    iap = rules["google_compute_firewall.iap_ssh"]
    assert iap["count"] == "${var.ssh_via_iap ? 1 : 0}" and tf["variable"]["ssh_via_iap"]["default"] is False
    assert iap["source_ranges"] == [IAP_RANGE]
    assert iap["target_service_accounts"] == ["${google_service_account.vms.email}"]
    assert block(iap, "allow") == {"protocol": "tcp", "ports": ["22"]}


def test_terraform_validates_with_the_google_provider(tmp_path: Path) -> None:
    """Offline: `terraform init -plugin-dir` needs the hashicorp/google provider on disk (it cannot be
    downloaded here); JOBPLANE_TF_PLUGIN_DIR names a directory laid out as terraform's plugin cache."""
    plugins = Path(os.environ.get("JOBPLANE_TF_PLUGIN_DIR", "/opt/tf-plugins"))
    if shutil.which("terraform") is None:
        pytest.skip("terraform not installed")
    if not list(plugins.glob("registry.terraform.io/hashicorp/google/*/*")):
        pytest.skip(f"no hashicorp/google provider under {plugins}: terraform validate cannot run offline")
    work = tmp_path / "gcp"
    shutil.copytree(INFRA, work, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    for step in (["init", "-backend=false", "-input=false", f"-plugin-dir={plugins}"], ["validate"]):
        done = subprocess.run(["terraform", *step, "-no-color"], cwd=work, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr


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
    assert "-m jobplane.boot.bundling --cloud gcp --out build/agent" in makefile


# ---- owners and notifications -----------------------------------------------------------------------------
def _rendered(tf: dict[str, dict[str, Any]], expression: str, bucket: str, prefix: str, owner: str) -> str:
    """A submitter grant's condition as IAM sees it for one owner of a deployment: the locals it names filled in."""
    values = {"objects": tf["locals"]["objects"], "bucket": bucket, "prefix": prefix}
    for name, value in values.items():  # outermost first: objects names the other two
        expression = expression.replace("${local." + name + "}", value)
    expression = expression.replace("${each.value.owner}", owner)
    assert "${" not in expression, expression
    return expression


def _submitter_condition(tf: dict[str, dict[str, Any]], grant: str) -> str:
    return str(block(tf["resource"][f"google_storage_bucket_iam_member.{grant}"], "condition")["expression"])


def test_a_submitter_creates_objects_only_under_its_own_owners_folders(tf: dict[str, dict[str, Any]]) -> None:
    grant = tf["resource"]["google_storage_bucket_iam_member.submitters_write"]
    assert grant["for_each"] == "${local.submitter_grants}"
    assert "var.submitters" in str(tf["locals"]["submitter_grants"])
    assert (grant["role"], grant["member"]) == ("roles/storage.objectCreator", "${each.value.member}")
    for root in ("", "team-root/"):
        team_a = _rendered(tf, _submitter_condition(tf, "submitters_write"), "B", root, "team-a")

        def may_create(key: str, cel: str = team_a, root: str = root) -> bool:
            return _cel(cel, f"projects/_/buckets/B/objects/{root}{key}")

        assert may_create("queue/team-a/train-1.yaml") and may_create("code/team-a/train-1.tar.gz")
        assert may_create(keys.cancel_request("team-a", "train-1"))
        for key in ("queue/team-b/train-1.yaml", "queue/team-ab/x.yaml", "code/team-b/x.tar.gz", "queue/x.yaml",
                    "jobs/train-1/job.json", "config/policy.yaml", "heartbeats/train-1/1/0",
                    keys.cancel_request("team-b", "train-1"), "teams/team-a/train-1/logs/1/0/00000001.log"):
            assert not may_create(key), key
        assert not _cel(team_a, "projects/_/buckets/other/objects/queue/team-a/x.yaml")
    assert tf["variable"]["submitters"]["default"] == {}


def test_a_submitter_reads_every_teams_records_and_only_its_own_teams_data(tf: dict[str, dict[str, Any]]) -> None:
    read = tf["resource"]["google_storage_bucket_iam_member.submitters_read"]
    assert (read["role"], read["member"], read["for_each"]) == ("roles/storage.objectViewer", "${each.value.member}",
                                                                "${local.submitter_grants}")
    expression = _submitter_condition(tf, "submitters_read")
    assert expression.count("||") + expression.count("&&") + expression.count("!") <= 12  # IAM's most
    for root in ("", "team-root/"):
        team_a = _rendered(tf, expression, "B", root, "team-a")

        def may_read(key: str, cel: str = team_a, root: str = root) -> bool:
            return _cel(cel.replace("resource.name ==", "name =="), f"projects/_/buckets/B/objects/{root}{key}")

        own = keys.JobData("x", "team-a")
        for key in (keys.job_record("x"), keys.stop_request("x"), keys.cluster("x", 1), "queue/team-b/y.yaml",
                    "rejected/y.error.json", "sweeps/s/sweep.json", "admission/owners/team-b.json",
                    "active/x/RUNNING.1", "active-sweeps/s", keys.heartbeat("x", 1, 0), keys.preempted_marker("x"),
                    keys.POLICY, keys.log_chunk(own, 1, 0, 1), keys.checkpoints_prefix(own) + "manifests/0/1.json",
                    "code/team-a/x.tar.gz"):
            assert may_read(key), key
        other = keys.JobData("y", "team-b")
        for key in (keys.log_chunk(other, 1, 0, 1), keys.checkpoints_prefix(other) + "files/0/a",
                    "code/team-b/y.tar.gz", "teams/team-ab/y/logs/1/0/00000001.log", "config/policy.yaml.bak",
                    "system/agent/manifest.json", "cancels/team-a/x", "after/x/y",
                    "budget-notices/2025-01/team-a.warning"):
            assert not may_read(key), key


def test_a_submitter_lists_the_registry_with_a_role_that_holds_nothing_else(tf: dict[str, dict[str, Any]]) -> None:
    role = tf["resource"]["google_project_iam_custom_role.submitters_list"]
    assert role["role_id"] == "jobplaneSubmittersList" and role["permissions"] == ["storage.objects.list"]
    grant = tf["resource"]["google_storage_bucket_iam_member.submitters_list"]
    assert grant["role"] == "${google_project_iam_custom_role.submitters_list.name}"
    assert grant["bucket"] == "${google_storage_bucket.registry.name}" and "condition" not in grant  # GCS checks a
    assert grant["for_each"] == "${toset(distinct(flatten(values(var.submitters))))}"  # listing on the bucket


def test_the_local_cloud_enforces_exactly_the_submitters_grants(tf: dict[str, dict[str, Any]]) -> None:
    """jobplane.local.gcp_grants, which the GCS fake enforces on a member's token, renders main.tf's conditions."""
    for bucket, root in (("jobplane-local", ""), ("b", "team-root")):
        for owner in ("team-a", "vision_2"):
            prefix = f"{root}/" if root else ""
            assert _rendered(tf, _submitter_condition(tf, "submitters_write"), bucket, prefix, owner) == \
                gcp_grants.write_condition(bucket, root, owner)
            assert _rendered(tf, _submitter_condition(tf, "submitters_read"), bucket, prefix, owner) == \
                gcp_grants.read_condition(bucket, root, owner)
    grants = {name: tf["resource"][f"google_storage_bucket_iam_member.{name}"]["role"]
              for name in ("submitters_write", "submitters_read")}
    assert grants == {"submitters_write": gcp_grants.WRITE_ROLE, "submitters_read": gcp_grants.READ_ROLE}
    listing = tf["resource"]["google_project_iam_custom_role.submitters_list"]["permissions"]
    assert tuple(listing) == gcp_grants.LIST_PERMISSIONS
    [pattern] = re.findall(r'regex\("([^"]+)"', block(tf["variable"]["submitters"], "validation")["condition"])
    assert pattern == keys.LABEL_KEY  # the owners the mirror accepts are the module's


def test_a_member_reaches_its_own_teams_keys_and_creates_only_in_its_own_folders() -> None:
    rules = gcp_grants.member_rules("b", "reg", "team-a")

    def may(permission: str, key: str) -> bool:
        return fake_sts.allowed(rules, permission, "b", f"reg/{key}")

    own, other = keys.JobData("x", "team-a"), keys.JobData("y", "team-b")
    for key in (keys.job_record("x"), keys.logs_prefix(own) + "1/0/00000001.log", "code/team-a/x.tar.gz",
                keys.POLICY, "queue/team-b/y.yaml", keys.stop_request("y")):
        assert may("get", key), key
    for key in (keys.logs_prefix(other) + "1/0/00000001.log", "code/team-b/y.tar.gz", "system/agent/manifest.json",
                "cancels/team-b/y"):
        assert not may("get", key), key
    for key in ("queue/team-a/x.yaml", "code/team-a/x.tar.gz", keys.cancel_request("team-a", "x")):
        assert may("create", key) and not may("delete", key), key  # create-only: no overwrite
    for key in (keys.job_record("x"), "queue/team-b/x.yaml", keys.cancel_request("team-b", "x"),
                keys.logs_prefix(own) + "1/0/00000001.log", "queue/x.yaml"):
        assert not may("create", key), key
    assert fake_sts.allowed(rules, "list", "b", list_prefix="reg/jobs/")
    assert fake_sts.allowed(rules, "list", "b", list_prefix="reg/teams/team-b/")  # names only: GCS cannot scope it
    assert not fake_sts.allowed(rules, "get", "other", "reg/jobs/x/job.json")
    assert not fake_sts.allowed(rules, "list", "other", list_prefix="")
    assert gcp_grants.token_rules("member-team-a", "b/reg") == rules
    assert gcp_grants.token_rules("member-Team')||true", "b/reg") == ()  # no owner: refused everything
    assert gcp_grants.token_rules("sts-0123", "b/reg") is None  # not a member's: the fake's other rules


def test_notifications_go_to_a_topic_only_the_functions_publish_to(tf: dict[str, dict[str, Any]]) -> None:
    topic = tf["resource"]["google_pubsub_topic.notifications"]
    assert topic["name"] == "jobplane-jobs"
    assert tf["locals"]["env"]["JOBPLANE_NOTIFY_TOPIC"] == "${google_pubsub_topic.notifications.id}"
    assert tf["locals"]["env"]["PYDANTIC_DISABLE_PLUGINS"] == "__all__"  # what the AWS functions are given too
    publish = tf["resource"]["google_pubsub_topic_iam_member.functions_publish"]
    assert (publish["topic"], publish["role"], publish["member"]) == ("${google_pubsub_topic.notifications.id}",
                                                                      "roles/pubsub.publisher",
                                                                      "${google_service_account.functions.member}")
    publishers = [b for b in tf["resource"].values() if b.get("role") == "roles/pubsub.publisher"]
    assert {b["member"] for b in publishers} == {"${google_service_account.functions.member}",
                                                 "${data.google_storage_project_service_account.gcs.member}"}
    assert tf["resource"]["google_pubsub_subscription.notifications"]["count"] == \
        "${var.notification_subscription ? 1 : 0}"
    assert "notification_topic" in tf["output"]


# ---- what a job VM's own identity may do in the registry (the conditions evaluated on object names) ---------
def _vm_registry_grants(tf: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in tf["resource"].values() if b.get("member") == "${google_service_account.vms.member}"
            and b.get("bucket") == "${google_storage_bucket.registry.name}"]


def vm_may_reach(tf: dict[str, dict[str, Any]], key: str, bucket: str = "b", prefix: str = "reg/") -> bool:
    """Whether any registry grant of the VM account holds on the object `prefix + key` of `bucket`: each grant's
    condition (CEL's startsWith / endsWith / extract, || and &&) evaluated with the locals it names filled in;
    a grant without a condition holds everywhere."""
    reached = False
    for grant in _vm_registry_grants(tf):
        if "condition" not in grant:
            return True
        expression = block(grant, "condition")["expression"]
        for name in ("vm_read_expression", "objects", "bucket", "prefix"):  # outermost first: each names the next
            value = {"bucket": bucket, "prefix": prefix}.get(name) or tf["locals"][name]
            expression = expression.replace("${local." + name + "}", value)
        assert "${" not in expression, expression
        reached = reached or _cel(expression, f"projects/_/buckets/{bucket}/objects/{prefix}{key}")
    return reached


def _cel(expression: str, name: str) -> bool:
    def extract(name: str, template: str) -> str:  # IAM's extract(): the text the {placeholder} spans, or ''
        before, _, rest = template.partition("{")
        after = rest.partition("}")[2]
        start = name.find(before)
        if start < 0:
            return ""
        start += len(before)
        end = name.find(after, start)
        return "" if end < 0 else name[start:end]

    python = (expression.replace("resource.name.startsWith(", "name.startswith(")
              .replace("resource.name.endsWith(", "name.endswith(")
              .replace("resource.name.extract(", "extract(name, ")
              .replace("||", " or ").replace("&&", " and "))
    return bool(eval(python, {"extract": extract, "name": name}))  # our own expression, from our own Terraform


def test_a_vms_own_identity_reads_the_agent_bundles_and_nothing_else_in_the_registry(
        tf: dict[str, dict[str, Any]]) -> None:
    grants = _vm_registry_grants(tf)
    assert grants and {g["role"] for g in grants} == {"roles/storage.objectViewer"}  # no write of any kind
    assert all("condition" in g for g in grants), "a VM's own token never lists or reads the whole registry"
    for key in ("system/agent/manifest.json", "system/agent/gcp-py3.12-x86_64.tar.gz"):
        assert vm_may_reach(tf, key), key
    others = [keys.job_record("j"), keys.heartbeat("j", 1, 0), "jobs/j/logs/1/0/00000001.log", keys.cluster("j", 1),
              keys.checkpoints_prefix(keys.JobData("j", "alice")) + "manifests/0/00000001.json",
              keys.checkpoints_prefix(keys.JobData("j")) + "manifests/0/00000001.json", keys.exit_report("j", 1, 0),
              keys.boot_failure("j", 1), keys.preempted_marker("j"), keys.stop_request("j"), "code/alice/j.tar.gz",
              "jobs/j/code/code.tar.gz", "config/policy.yaml", "queue/alice/j.yaml", "active/j/RUNNING.1",
              "systemx/agent/a", "jobs/system/agent/x"]
    for key in others:
        assert not vm_may_reach(tf, key), key
    assert not vm_may_reach(tf, "team/system/agent/manifest.json")  # under the root only, not anywhere below


def test_the_vend_function_is_invoked_by_the_job_vms_only_and_told_their_account(
        tf: dict[str, dict[str, Any]]) -> None:
    main_py = (REPO / "functions" / "gcp" / "main.py").read_text()
    assert "def vend(request: flask.Request)" in main_py
    fn = tf["resource"]["google_cloudfunctions2_function.vend"]
    assert block(fn, "build_config")["entry_point"] == "vend"
    assert block(block(fn, "build_config"), "source") == block(
        tf["resource"]["google_cloudfunctions2_function.launcher"]["build_config"][0], "source")  # the same zip
    service = block(fn, "service_config")
    assert service["service_account_email"] == "${google_service_account.functions.email}"
    assert "JOBPLANE_VM_SERVICE_ACCOUNT = google_service_account.vms.email" in service["environment_variables"]
    assert tf["locals"]["vend_url"] == "https://${var.region}-${var.project}.cloudfunctions.net/jobplane-vend"
    assert fn["name"] == "jobplane-vend" and tf["locals"]["env"]["JOBPLANE_VEND_URL"] == "${local.vend_url}"
    for name in ("launcher", "http"):  # the launcher and rerun (and every other function) tell the VMs where
        env = block(tf["resource"][f"google_cloudfunctions2_function.{name}"], "service_config")
        assert env["environment_variables"] == "${local.env}"
    service_name = "${google_cloudfunctions2_function.vend.service_config[0].service}"
    invokers = [b for b in tf["resource"].values() if b.get("service") == service_name]
    assert [(b["role"], b["member"]) for b in invokers] == [("roles/run.invoker",
                                                            "${google_service_account.vms.member}")]
    assert "vend_url" in tf["output"]
