"""`make checkov`: checkov over the synthesized AWS template and infra/gcp, held to infra/checkov-skips.yaml.

checkov (a tool we did not write) runs once per framework, both at once, from its own venv. A failing check
passes the gate only where the skip file names its check and resource, with the reason jobplane accepts it; any
other failure fails the build, and so does a skip entry that no failure matches (so the file stays true). It
prints, per framework, what passed, what failed and what the skip file accepted.

    python -m infra.checkov_gate --checkov .venv-checkov/bin/checkov --template T.json --terraform infra/gcp
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SKIPS = Path(__file__).with_name("checkov-skips.yaml")
SKIPS_NAME = f"{SKIPS.parent.name}/{SKIPS.name}"  # as messages name it
# how checkov is pointed at each framework's input: a template file, a Terraform module's directory
TARGET_FLAG = {"cloudformation": "--file", "terraform": "--directory"}
CHECK_ID = re.compile(r"CKV2?_[A-Z0-9]+_\d+")


class SkipFileError(ValueError):
    """The skip file is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class Skip:
    """One accepted check on the resources its patterns name (checkov's names; `*` is any run of characters)."""

    check: str
    resources: tuple[str, ...]
    reason: str

    def covering(self, finding: Finding) -> str | None:
        """The pattern of this entry that accepts the finding, if any."""
        if finding.check != self.check:
            return None
        return next((p for p in self.resources if _pattern(p).fullmatch(finding.resource)), None)


@dataclass(frozen=True)
class Finding:
    check: str
    resource: str
    title: str


@dataclass
class Verdict:
    framework: str
    passed: int
    failed: list[Finding] = field(default_factory=list)  # failing and not accepted: these fail the build
    accepted: list[Finding] = field(default_factory=list)
    stale: list[tuple[Skip, str]] = field(default_factory=list)  # patterns that matched no failure

    @property
    def ok(self) -> bool:
        return not self.failed and not self.stale

    def lines(self) -> list[str]:
        out = [f"checkov {self.framework}: {self.passed} passed, {len(self.failed)} failed, "
               f"{len(self.accepted)} skipped ({SKIPS_NAME})"]
        out += [f"  FAILED {f.check} {f.resource}: {f.title}" for f in self.failed]
        out += [f"  STALE  {s.check} {pattern}: in {SKIPS_NAME}, but no such failure (remove it)"
                for s, pattern in self.stale]
        return out


def _pattern(glob: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")))


def parse_skips(document: Any) -> dict[str, list[Skip]]:
    """The skip file's entries by framework, every field checked: a bad one is refused, naming it."""
    if not isinstance(document, Mapping):
        raise SkipFileError(f"{SKIPS_NAME}: a mapping of framework to entries, not {type(document).__name__}")
    out: dict[str, list[Skip]] = {}
    for framework, entries in document.items():
        if framework not in TARGET_FLAG:
            raise SkipFileError(f"{SKIPS_NAME}: {framework!r} is not one of {', '.join(TARGET_FLAG)}")
        if not isinstance(entries, list):
            raise SkipFileError(f"{SKIPS_NAME}: {framework}: a list of entries")
        out[framework] = [_skip(f"{framework}[{i}]", entry) for i, entry in enumerate(entries)]
    return out


def _skip(where: str, entry: Any) -> Skip:
    if not isinstance(entry, Mapping) or set(entry) != {"check", "resources", "reason"}:
        raise SkipFileError(f"{SKIPS_NAME}: {where}: needs exactly check, resources and reason")
    check, resources, reason = entry["check"], entry["resources"], entry["reason"]
    if not isinstance(check, str) or not CHECK_ID.fullmatch(check):
        raise SkipFileError(f"{SKIPS_NAME}: {where}.check: {check!r} is not a checkov check id (CKV_AWS_117)")
    if not isinstance(resources, list) or not resources or not all(isinstance(r, str) and r for r in resources):
        raise SkipFileError(f"{SKIPS_NAME}: {where}.resources: a list of resource names or patterns")
    if not isinstance(reason, str) or len(reason.split()) < 5:
        raise SkipFileError(f"{SKIPS_NAME}: {where}.reason: say why jobplane accepts {check} there")
    return Skip(check, tuple(resources), reason.strip())


def judge(framework: str, report: Mapping[str, Any], skips: Sequence[Skip]) -> Verdict:
    """What checkov's JSON report for one framework (run with --quiet: failures only, and the counts) means."""
    summary = report.get("summary", report)
    if summary.get("parsing_errors"):
        raise RuntimeError(f"checkov {framework}: {summary['parsing_errors']} file(s) did not parse")
    if not summary.get("resource_count") or "results" not in report:
        raise RuntimeError(f"checkov {framework}: no resource was checked: {json.dumps(summary)}")
    verdict = Verdict(framework, int(summary["passed"]))
    used: set[tuple[str, str]] = set()
    for raw in report["results"]["failed_checks"]:
        finding = Finding(raw["check_id"], raw["resource"], raw["check_name"])
        covered = [(s.check, p) for s in skips if (p := s.covering(finding))]
        used.update(covered)
        (verdict.accepted if covered else verdict.failed).append(finding)
    verdict.stale = [(s, p) for s in skips for p in s.resources if (s.check, p) not in used]
    return verdict


def run_checkov(checkov: Path, framework: str, target: Path) -> dict[str, Any]:
    """checkov's JSON report for one framework. --skip-download: nothing leaves this machine (no guidelines)."""
    done = subprocess.run([str(checkov), TARGET_FLAG[framework], str(target), "--framework", framework,
                           "--output", "json", "--quiet", "--compact", "--skip-download"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 1):  # 1: some check failed, which judge() reads from the report
        raise RuntimeError(f"checkov {framework} exited {done.returncode}: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--checkov", type=Path, required=True, help="the checkov executable")
    parser.add_argument("--template", type=Path, required=True, help="the synthesized CloudFormation template")
    parser.add_argument("--terraform", type=Path, required=True, help="the Terraform module (infra/gcp)")
    args = parser.parse_args(argv)
    skips = parse_skips(yaml.safe_load(SKIPS.read_text()))
    targets = {"cloudformation": args.template, "terraform": args.terraform}
    with ThreadPoolExecutor(len(targets)) as pool:
        reports = {fw: pool.submit(run_checkov, args.checkov, fw, target) for fw, target in targets.items()}
        verdicts = [judge(fw, report.result(), skips.get(fw, [])) for fw, report in reports.items()]
    for verdict in verdicts:
        print("\n".join(verdict.lines()))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
