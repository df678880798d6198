"""infra/checkov_gate.py, the judge of `make checkov`: what a checkov report means against the skip file, and the
committed skip file itself. (`make checkov` and tests/infra/test_checkov.py run checkov for real; these need neither
it nor a synth.)"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.checkov_gate import SKIPS, Finding, Skip, SkipFileError, judge, parse_skips

REASON = "the control is enforced another way, here"


def report(*failed: tuple[str, str], passed: int = 7) -> dict[str, Any]:
    """checkov's JSON for one framework, as --quiet writes it: the failures and the counts."""
    failures = [{"check_id": check, "resource": resource, "check_name": f"{check} title"} for check, resource in failed]
    return {"results": {"failed_checks": failures},
            "summary": {"passed": passed, "failed": len(failed), "skipped": 0, "parsing_errors": 0,
                        "resource_count": 20}}


def test_the_committed_skip_file_gives_a_reason_for_every_entry() -> None:
    skips = parse_skips(yaml.safe_load(SKIPS.read_text()))
    assert set(skips) == {"cloudformation", "terraform"}
    assert all(len(s.reason.split()) >= 20 for entries in skips.values() for s in entries)  # a reason, not a word


def test_a_failure_the_skip_file_accepts_passes_and_any_other_fails_naming_it() -> None:
    skips = [Skip("CKV_AWS_117", ("AWS::Lambda::Function.ControlPlane*",), REASON)]
    verdict = judge("cloudformation", report(("CKV_AWS_117", "AWS::Lambda::Function.ControlPlaneLauncher05C6452E"),
                                             ("CKV_AWS_117", "AWS::Lambda::Function.Other1234"),
                                             ("CKV_AWS_115", "AWS::Lambda::Function.ControlPlaneVend693A9E8E")),
                    skips)
    assert verdict.accepted == [Finding("CKV_AWS_117", "AWS::Lambda::Function.ControlPlaneLauncher05C6452E",
                                        "CKV_AWS_117 title")]
    assert [(f.check, f.resource) for f in verdict.failed] == [
        ("CKV_AWS_117", "AWS::Lambda::Function.Other1234"),  # another resource
        ("CKV_AWS_115", "AWS::Lambda::Function.ControlPlaneVend693A9E8E")]  # another check
    assert not verdict.ok
    assert verdict.lines()[0] == "checkov cloudformation: 7 passed, 2 failed, 1 skipped (infra/checkov-skips.yaml)"
    assert "  FAILED CKV_AWS_115 AWS::Lambda::Function.ControlPlaneVend693A9E8E: CKV_AWS_115 title" in verdict.lines()


def test_a_pattern_is_literal_but_for_its_stars() -> None:
    skip = Skip("CKV_GCP_124", ('google_cloudfunctions2_function.http["sweeper"]',), REASON)
    assert judge("terraform", report(("CKV_GCP_124", 'google_cloudfunctions2_function.http["sweeper"]')), [skip]).ok
    assert not judge("terraform", report(("CKV_GCP_124", 'google_cloudfunctions2_function.http["s"]')), [skip]).ok


def test_an_entry_no_failure_matches_fails_the_gate_as_stale() -> None:
    skip = Skip("CKV_GCP_83", ("google_pubsub_topic.notifications", "google_pubsub_topic.gone"), REASON)
    verdict = judge("terraform", report(("CKV_GCP_83", "google_pubsub_topic.notifications")), [skip])
    assert verdict.failed == [] and verdict.stale == [(skip, "google_pubsub_topic.gone")] and not verdict.ok
    assert any(line.startswith("  STALE  CKV_GCP_83 google_pubsub_topic.gone") for line in verdict.lines())
    assert judge("terraform", report(passed=9), []).ok  # nothing failing, nothing skipped


def test_a_report_that_checked_nothing_or_did_not_parse_is_an_error() -> None:
    empty = {"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0, "resource_count": 0}  # no such directory
    with pytest.raises(RuntimeError, match="no resource was checked"):
        judge("terraform", empty, [])
    broken = report()
    broken["summary"]["parsing_errors"] = 1
    with pytest.raises(RuntimeError, match="did not parse"):
        judge("cloudformation", broken, [])


@pytest.mark.parametrize(("document", "names"), [
    ({"cloudformation": [{"check": "CKV_AWS_117", "resources": ["x"]}]}, "cloudformation[0]: needs exactly"),
    ({"cloudformation": [{"check": "AWS_117", "resources": ["x"], "reason": REASON}]}, "cloudformation[0].check"),
    ({"terraform": [{"check": "CKV_GCP_83", "resources": [], "reason": REASON}]}, "terraform[0].resources"),
    ({"terraform": [{"check": "CKV_GCP_83", "resources": ["x"], "reason": "cost"}]}, "terraform[0].reason"),
    ({"kubernetes": []}, "'kubernetes' is not one of"),
    ([], "a mapping of framework"),
])
def test_a_malformed_skip_file_is_refused_naming_the_entry_and_field(document: Any, names: str) -> None:
    with pytest.raises(SkipFileError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_skips(document)
