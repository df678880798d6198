"""The control plane's function roles as `cdk synth` writes them, for the local AWS cloud (jobplane.local.stack_iam):
`python -m infra.aws.iam_export OUT.json` synthesizes the default stack (cdk.json's context) and writes each
function's role statements, intrinsics unresolved, with the types of the resources they refer to.

The roles do not depend on what the Lambda and agent assets contain, so empty directories stand in for them: the
export needs no PyPI and no bundle build, only the synth itself (about 10 CPU seconds)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FUNCTION_PREFIX = "functions.aws."


def template(outdir: Path) -> dict[str, Any]:
    import aws_cdk as cdk

    from infra.aws import bundle
    from infra.aws.stack import JobplaneStack

    empty = outdir / "empty-asset"
    empty.mkdir(parents=True, exist_ok=True)
    (empty / "placeholder").write_text("the roles do not depend on the assets' contents\n")
    bundle.lambda_asset = lambda: empty
    bundle.agent_bundles = lambda pythons: empty
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    app = cdk.App(outdir=str(outdir / "cdk.out"), context={**context, "aws:cdk:disable-asset-staging": True})
    JobplaneStack(app, "Jobplane")
    app.synth()
    return dict(json.loads((outdir / "cdk.out" / "Jobplane.template.json").read_text()))


def export(template: dict[str, Any]) -> dict[str, Any]:
    """{"functions": {name: [policy document, ...]}, "types": {logical id: resource type}}: every policy attached to
    each jobplane function's role (launcher, sweeper, rerun, uptime_cap, vend)."""
    resources: dict[str, dict[str, Any]] = template["Resources"]
    roles = {}
    for fn in resources.values():
        handler = fn["Properties"].get("Handler", "") if fn["Type"] == "AWS::Lambda::Function" else ""
        if handler.startswith(FUNCTION_PREFIX):
            roles[fn["Properties"]["Role"]["Fn::GetAtt"][0]] = handler.split(".")[2]
    functions: dict[str, list[dict[str, Any]]] = {name: [] for name in roles.values()}
    for res in resources.values():
        if res["Type"] != "AWS::IAM::Policy":
            continue
        for role in res["Properties"].get("Roles", []):
            if role.get("Ref") in roles:
                functions[roles[role["Ref"]]].append(res["Properties"]["PolicyDocument"])
    for role_id in roles:
        props = resources[role_id]["Properties"]
        if props.get("Policies") or props.get("ManagedPolicyArns"):
            raise ValueError(f"{role_id} has policies outside AWS::IAM::Policy: the export would miss them")
    return {"functions": functions, "types": {k: v["Type"] for k, v in resources.items()}}


def main(argv: list[str] | None = None) -> None:
    (out,) = argv if argv is not None else sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="jobplane-iam-export-") as tmp:
        Path(out).write_text(json.dumps(export(template(Path(tmp))), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
