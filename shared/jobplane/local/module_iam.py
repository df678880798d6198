"""What infra/gcp grants the functions' service account, as the local GCP cloud enforces it: read from the module's
own .tf files (python-hcl2), so the fakes hold the functions to what `terraform apply` deploys.

- GCS (jobplane.local.fake_gcs): functions_registry's role on the registry bucket, and nothing in any other bucket.
- Compute Engine (jobplane.local.fake_compute): functions_compute's permissions on anything, functions_own_vms'
  only on a VM whose name starts with the deployment's prefix (the binding's condition, which must read exactly
  as CONDITION does), and iam.serviceAccounts.actAs on the VMs' service account alone (functions_act_as_vms).

The functions carry FUNCTIONS_TOKEN (JOBPLANE_GCS_TOKEN and JOBPLANE_COMPUTE_TOKEN in their environment), the
token their service account's metadata server would give them on GCP. $JOBPLANE_LOCAL_MODULE_IAM names a JSON
file of these grants instead of the module's (a test's, with one permission taken out).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobplane.local import cache_dir

FUNCTIONS_TOKEN = "sa-jobplane-functions"  # the GCS and Compute fakes' token for the functions' service account
EXPORT_ENV = "JOBPLANE_LOCAL_MODULE_IAM"
MODULE = Path(__file__).resolve().parents[3] / "infra" / "gcp"
# functions_own_vms' condition, ${local.vm_name_prefix} as the module writes it
CONDITION = ("resource.type != 'compute.googleapis.com/Instance' || "
             "resource.name.extract('/instances/{name}').startsWith('${local.vm_name_prefix}')")


@dataclass(frozen=True)
class FunctionGrants:
    registry_role: str  # on the registry bucket
    compute: frozenset[str]  # on the project
    own_vms: frozenset[str]  # on the project, under CONDITION: VMs named with the deployment's prefix only
    act_as_vms: bool  # iam.serviceAccountUser on the VMs' service account

    def export(self) -> dict[str, Any]:
        return {"registry_role": self.registry_role, "compute": sorted(self.compute),
                "own_vms": sorted(self.own_vms), "act_as_vms": self.act_as_vms}

    @classmethod
    def from_export(cls, doc: Mapping[str, Any]) -> FunctionGrants:
        return cls(str(doc["registry_role"]), frozenset(doc["compute"]), frozenset(doc["own_vms"]),
                   bool(doc["act_as_vms"]))


def clean(value: Any) -> Any:
    """python-hcl2 keeps string quotes and marks blocks: plain values."""
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def resources(module: Path = MODULE) -> dict[str, dict[str, Any]]:
    """Every resource of the module's .tf files, by "type.name"."""
    import hcl2  # python-hcl2 (the dev extra), as the Terraform tests read it

    found: dict[str, dict[str, Any]] = {}
    for path in sorted(module.glob("*.tf")):
        with path.open() as f:
            doc = clean(hcl2.load(f))
        for entry in doc.get("resource", []):
            for kind, named in entry.items():
                for name, body in named.items():
                    found[f"{kind}.{name}"] = body
    return found


def read_module(module: Path = MODULE) -> FunctionGrants:
    """The functions' grants as the module's resources define them; ValueError where they are not as the fakes
    can enforce them (a binding of theirs moved to another member, a condition that reads otherwise)."""
    tf = resources(module)
    member = "${google_service_account.functions.member}"

    def binding(name: str) -> dict[str, Any]:
        body = tf[name]
        if body.get("member") != member:
            raise ValueError(f"{name}: not the functions' service account's binding")
        return body

    def role(custom: str) -> frozenset[str]:
        return frozenset(tf[f"google_project_iam_custom_role.{custom}"]["permissions"])

    registry = binding("google_storage_bucket_iam_member.functions_registry")
    if "condition" in registry:
        raise ValueError("functions_registry: a condition the GCS fake does not enforce")
    plain = binding("google_project_iam_member.functions_compute")
    guarded = binding("google_project_iam_member.functions_own_vms")
    conditions = guarded.get("condition") or [{}]
    condition = conditions[0] if isinstance(conditions, list) else conditions
    if "condition" in plain or condition.get("expression") != CONDITION:
        raise ValueError(f"functions_own_vms' condition is not {CONDITION!r}: the Compute fake enforces that one")
    act_as = tf.get("google_service_account_iam_member.functions_act_as_vms", {})
    return FunctionGrants(
        registry_role=str(registry["role"]),
        compute=role("functions_compute") if plain["role"].endswith("functions_compute.name}") else frozenset(),
        own_vms=role("functions_own_vms") if guarded["role"].endswith("functions_own_vms.name}") else frozenset(),
        act_as_vms=(act_as.get("member") == member and act_as.get("role") == "roles/iam.serviceAccountUser"
                    and act_as.get("service_account_id") == "${google_service_account.vms.name}"))


def load() -> FunctionGrants | None:
    """The grants the local cloud enforces: $JOBPLANE_LOCAL_MODULE_IAM's, else the module's; None where neither can
    be read here (no python-hcl2: the functions' calls then go unchecked, as before this module)."""
    path = os.environ.get(EXPORT_ENV)
    if path:
        return FunctionGrants.from_export(json.loads(Path(path).read_text()))
    # kept by a digest of the .tf files: a parse costs about 0.3 CPU s, and the tests start a cloud a minute
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sorted(MODULE.glob("*.tf"))))
    kept = cache_dir() / "module-iam" / f"{digest.hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return FunctionGrants.from_export(json.loads(kept.read_text()))
    try:
        grants = read_module()
    except ImportError:
        return None
    with contextlib.suppress(OSError):
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(grants.export()))
        tmp.replace(kept)
    return grants
