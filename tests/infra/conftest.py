"""One synthesis of the stack per session (with cdk-nag on, as app.py runs it), shared by every infra test, or none
where a run with the same inputs kept its assembly (assemblies.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobplane.model.policy import Policy, parse_policy
from tests.infra.assemblies import synthesized
from tests.infra.iam_eval import resolve

ROOT = Path(__file__).resolve().parents[2]
ALARM_EMAIL = "platform@example.com"
NOTIFY_EMAIL = "ml-team@example.com"
DATA_BUCKET = "my-datasets"


@dataclass(frozen=True)
class Synth:
    outdir: Path
    template: dict[str, Any]

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == kind}

    def functions(self) -> dict[str, dict[str, Any]]:
        """Our five functions by module name (launcher, sweeper, rerun, uptime_cap, vend)."""
        out = {}
        for fn in self.resources("AWS::Lambda::Function").values():
            handler = fn["Properties"].get("Handler", "")
            if handler.startswith("functions.aws."):
                out[handler.split(".")[2]] = fn
        return out

    def asset_dir(self, object_key: str) -> Path:
        """The staged directory CDK zips into the S3 object `object_key` at publish time."""
        manifest = json.loads((self.outdir / "Jobplane.assets.json").read_text())
        for asset in manifest["files"].values():
            if any(d["objectKey"] == object_key for d in asset["destinations"].values()):
                assert asset["source"]["packaging"] == "zip"
                return self.outdir / asset["source"]["path"]
        raise KeyError(object_key)

    def logical_id(self, kind: str, contains: str) -> str:
        (found,) = [k for k in self.resources(kind) if contains in k]
        return found

    def nag_reports(self) -> list[dict[str, Any]]:
        """The policy-validation plugins' reports (cdk-nag) written by the synth."""
        return list(json.loads((self.outdir / "validation-report.json").read_text())["pluginReports"])

    def deployments(self) -> dict[str, dict[str, Any]]:
        """BucketDeployment properties by destination key prefix (config/, system/wheels/)."""
        return {d["Properties"]["DestinationBucketKeyPrefix"]: d["Properties"]
                for d in self.resources("Custom::CDKBucketDeployment").values()}

    def policy_text(self, prefix: str = "config/") -> str:
        """config/policy.yaml as uploaded, deploy-time tokens resolved to '<LogicalId>' / '<Id.Attr>'."""
        props = self.deployments()[prefix]
        (key,) = props["SourceObjectKeys"]
        text = (self.asset_dir(key) / "policy.yaml").read_text()
        for marker, value in props["SourceMarkers"][0].items():
            text = text.replace(marker, resolve(value).strip('"'))
        return text

    def policy(self, prefix: str = "config/") -> Policy:
        return parse_policy(self.policy_text(prefix))  # the launcher will parse exactly this


def cdk_context(**overrides: Any) -> dict[str, Any]:
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
    context.update(overrides)
    return context


def synthesize(outdir: Path, context: dict[str, Any], nag: bool) -> Synth:
    """The stack's assembly in outdir: synthesized, or as a run with the same inputs synthesized it (assemblies.py)."""
    def synth(into: Path) -> None:
        import aws_cdk as cdk
        from cdk_nag import AwsSolutionsChecks

        from infra.aws.stack import JobplaneStack

        app = cdk.App(outdir=str(into), context=context)
        JobplaneStack(app, "Jobplane")
        if nag:
            cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        app.synth()  # raises on any unacknowledged cdk-nag finding

    synthesized(outdir, context, nag, synth)
    return Synth(outdir, json.loads((outdir / "Jobplane.template.json").read_text()))


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    context = cdk_context(**{"jobplane:alarmEmail": ALARM_EMAIL, "jobplane:notifyEmail": NOTIFY_EMAIL,
                             "jobplane:dataBuckets": [DATA_BUCKET]})
    return synthesize(tmp_path_factory.mktemp("cdk.out"), context, nag=True)


# The other two jobplane:network choices (the session synth has the default, public).
def _network_synth(factory: pytest.TempPathFactory, network: str) -> Synth:
    return synthesize(factory.mktemp(f"cdk.out-{network}"), cdk_context(**{"jobplane:network": network}), nag=True)


@pytest.fixture(scope="session")
def private_nat(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return _network_synth(tmp_path_factory, "private-nat")


@pytest.fixture(scope="session")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return _network_synth(tmp_path_factory, "isolated")
