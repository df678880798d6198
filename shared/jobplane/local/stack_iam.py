"""The functions' roles as `cdk synth` defines them, for the local AWS cloud: each function (launcher, sweeper, rerun,
uptime_cap, vend) runs with a session of a role in moto holding exactly its role's statements in the synthesized
template, intrinsics resolved to the local cloud's resources (jobplane.local.moto_server enforces them).

A synth costs about 10 CPU seconds, so the local cloud never synthesizes at start: it reads the export
(infra/aws/iam_export.py) kept in jobplane.local.cache_dir()/stack-iam/ under a digest of what the roles are made of
(infra/aws/, cdk.json, the IAM documents and names in jobplane, aws-cdk-lib's version). `make test` builds it
beside the CDK assets (`python -m jobplane.local.stack_iam build`); a cloud that finds none builds it then, once.
$JOBPLANE_LOCAL_STACK_IAM names another export instead (a test's, with a grant taken out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from itertools import product
from pathlib import Path
from typing import Any

from jobplane.local import cache_dir, install_step

EXPORT_ENV = "JOBPLANE_LOCAL_STACK_IAM"
ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "shared" / "jobplane"
# What the functions' roles are made of: the stack, its context, and the package modules its statements come from
INPUTS = ("cdk.json", "infra/aws/*.py", "shared/jobplane/vending/*.py", "shared/jobplane/clouds/base.py",
          "shared/jobplane/model/keys.py", "shared/jobplane/decide/vend.py")
FUNCTIONS = ("launcher", "sweeper", "rerun", "uptime_cap", "vend")


def digest() -> str:
    from jobplane.boot.bundling import digest as sha

    try:
        cdk = metadata.version("aws-cdk-lib")
    except metadata.PackageNotFoundError:
        cdk = "none"
    files = sorted(p for pattern in INPUTS for p in ROOT.glob(pattern))
    return sha([cdk, *(f"{p.relative_to(ROOT)}\n".encode() + p.read_bytes() for p in files)])


def cached() -> Path:
    return cache_dir() / "stack-iam" / f"{digest()}.json"


def build() -> Path:
    """The export for this checkout, synthesized once per digest (written whole: a concurrent build loses nothing)."""
    target = cached()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    os.close(fd)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)]),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    try:
        subprocess.run([sys.executable, "-m", "infra.aws.iam_export", tmp], cwd=ROOT, env=env, check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load() -> dict[str, Any]:
    named = os.environ.get(EXPORT_ENV)
    return dict(json.loads(Path(named).read_text() if named else build().read_text()))


@dataclass(frozen=True)
class Local:
    """The local cloud's resources the template's intrinsics stand for."""

    bucket: str
    region: str
    account: str
    roles: Mapping[str, str]  # the template's role (its logical id holds this name: VmRole, JobRole) -> local ARN
    topic: str | None
    subnets: Sequence[str]
    security_group: str | None
    placement_group: str = "jobplane-local-cluster"


def _refer(kind: str, logical_id: str, attribute: str | None, local: Local) -> list[str]:
    """The local value(s) of a Ref (attribute None) or GetAtt; what has no local counterpart names itself, so it
    matches nothing here (a log group, the dead-letter queue: no function calls them itself)."""
    account, region = local.account, local.region
    if kind == "AWS::S3::Bucket" and "Registry" in logical_id:
        return [f"arn:aws:s3:::{local.bucket}" if attribute == "Arn" else local.bucket]
    if kind == "AWS::IAM::Role" and attribute == "Arn":
        for name, arn in local.roles.items():
            if name in logical_id:
                return [arn]
    if kind == "AWS::SNS::Topic" and local.topic:
        return [local.topic]
    if kind == "AWS::EC2::Subnet":
        return list(local.subnets)  # the stack's subnets stand for the local cloud's (one per zone)
    if kind == "AWS::EC2::SecurityGroup" and local.security_group:
        return [local.security_group]
    if kind == "AWS::EC2::PlacementGroup":
        return [local.placement_group]
    return [f"arn:aws:not-local:{region}:{account}:{logical_id}/{attribute or 'Ref'}"]


def values(node: Any, types: Mapping[str, str], local: Local) -> list[str]:
    """Every string an intrinsic (or a literal) stands for; a Join over a list-valued part is each of them."""
    pseudo = {"AWS::Partition": "aws", "AWS::Region": local.region, "AWS::AccountId": local.account,
              "AWS::URLSuffix": "amazonaws.com"}
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict) and len(node) == 1:
        (fn, arg), = node.items()
        if fn == "Ref":
            return [pseudo[arg]] if arg in pseudo else _refer(types[arg], arg, None, local)
        if fn == "Fn::GetAtt":
            return _refer(types[arg[0]], arg[0], arg[1], local)
        if fn == "Fn::Join":
            return ["".join(parts) for parts in product(*(values(p, types, local) for p in arg[1]))]
    raise ValueError(f"an intrinsic the local cloud does not resolve: {json.dumps(node)[:200]}")


def _intrinsic(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith(("Ref", "Fn::"))


def _resolved(value: Any, types: Mapping[str, str], local: Local) -> Any:
    """A policy document's element resolved: a list's intrinsics are each of their values, in place."""
    if isinstance(value, list):
        out = [v for item in value for v in (values(item, types, local) if _intrinsic(item) or isinstance(item, str)
                                             else [_resolved(item, types, local)])]
        return list(dict.fromkeys(out)) if all(isinstance(v, str) for v in out) else out
    if _intrinsic(value):
        found = values(value, types, local)
        return found[0] if len(found) == 1 else found
    if isinstance(value, dict):
        return {k: _resolved(v, types, local) for k, v in value.items()}
    return value


def documents(export: Mapping[str, Any], local: Local) -> dict[str, list[dict[str, Any]]]:
    """Each function's policy documents with the template's intrinsics resolved to the local cloud's resources."""
    types = export["types"]
    return {name: [_resolved(doc, types, local) for doc in docs] for name, docs in export["functions"].items()}


def main(argv: list[str] | None = None) -> int:
    """`python -m jobplane.local.stack_iam build`: the export for this checkout, into the cache."""
    return install_step(argv, "jobplane.local.stack_iam build", lambda: f"the functions' roles at {build()}",
                        "the functions' roles were not exported (the local cloud exports them at its start)")


if __name__ == "__main__":
    sys.exit(main())
