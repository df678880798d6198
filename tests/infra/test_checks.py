"""cdk-nag (AwsSolutions, policy-validation plugin API) and cfn-lint on the synthesized template."""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from infra import cfn_lint_gate
from tests.infra.conftest import Synth
from tests.infra.kept import kept

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]  # a cold cache downloads wheels

# Rule families we accept with a reason; a new family needs review (and a new entry here).
ACKNOWLEDGED_FAMILIES = {"IAM4", "IAM5", "L1", "S1", "SQS3", "SNS2"}


def acknowledgements(outdir: Path) -> dict[str, dict[str, str]]:
    """construct path -> {rule id: reason}, as recorded in the cloud assembly's metadata."""
    meta = json.loads((outdir / "Jobplane.metadata.json").read_text())
    found: dict[str, dict[str, str]] = {}
    for path, entries in meta.items():
        for entry in entries:
            if entry["type"] == "aws:cdk:acknowledged-rules":
                found.setdefault(path, {}).update(entry["data"])
    return found


@pytest.mark.parametrize("network", ["synth", "private_nat", "isolated"])
def test_cdk_nag_reports_no_unacknowledged_finding(network: str, request: pytest.FixtureRequest) -> None:
    # The session synths ran with AwsSolutionsChecks; it raises on any finding. The report says so too.
    synth: Synth = request.getfixturevalue(network)
    for plugin in synth.nag_reports():
        assert plugin["conclusion"] == "success", plugin["pluginName"]
        assert plugin["violations"] == []


def test_every_acknowledgement_is_a_known_family_with_a_specific_reason(synth: Synth) -> None:
    acks = {(path, rule): reason for path, rules in acknowledgements(synth.outdir).items()
            for rule, reason in rules.items() if "AwsSolutions" in rule}
    assert len(acks) > 10
    for (path, rule), reason in acks.items():
        family = re.match(r"AwsSolutions::AwsSolutions-([A-Z]+\d+)", rule)
        assert family and family.group(1) in ACKNOWLEDGED_FAMILIES, (path, rule)
        assert len(reason) >= 40, (path, rule, reason)
    # acknowledged where the finding is, never stack-wide
    assert all(path.count("/") >= 2 for path, _ in acks), sorted({p for p, _ in acks})


def test_cdk_nag_fails_the_synth_on_an_unacknowledged_finding(tmp_path: Path) -> None:
    import aws_cdk as cdk
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(outdir=str(tmp_path))
    sqs.Queue(cdk.Stack(app, "Bad"), "NoSsl")
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(RuntimeError, match="AwsSolutions-SQS4"):
        app.synth()


def test_cfn_lint_finds_nothing_but_the_warnings_its_skip_file_accepts(synth: Synth, private_nat: Synth,
                                                                       isolated: Synth) -> None:
    templates = [s.outdir / "Jobplane.template.json" for s in (synth, private_nat, isolated)]
    tool = Path(sys.executable).with_name("cfn-lint")
    findings = kept("cfn-lint", [*templates, version("cfn-lint")],  # the gate's rules are read below, each run
                    lambda: cfn_lint_gate.lint(templates, tool))
    assert not cfn_lint_gate.problems(findings, cfn_lint_gate.skips())


def test_the_cfn_lint_gate_refuses_an_error_an_unlisted_warning_and_a_stale_entry() -> None:
    warning = {"Level": "Warning", "Rule": {"Id": "W3005"}, "Message": "m",
               "Location": {"Path": ["Resources", "ControlPlaneLauncher05C6452E", "DependsOn", 1]}}
    accepted = cfn_lint_gate.skips()
    assert cfn_lint_gate.problems([warning], accepted) == []
    assert cfn_lint_gate.problems([{**warning, "Level": "Error"}], accepted)[0].startswith("Error W3005")
    other = {**warning, "Rule": {"Id": "W1001"}}
    assert any(p.startswith("Warning W1001") for p in cfn_lint_gate.problems([other], accepted))
    assert cfn_lint_gate.problems([], accepted) == [
        f"cfn-lint-skips.yaml: W3005 on {list(accepted[0].resources)} matches no finding: remove it"]
