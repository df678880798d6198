"""cfn-lint, the CloudFormation linter (a tool we did not write), over synthesized templates, held to
infra/cfn-lint-skips.yaml: no error passes; a warning or informational finding passes only where the skip file names
its rule and resource, with the reason; an entry that no finding matches fails too (so the file stays true).

    python -m infra.cfn_lint_gate T.json [T2.json ...]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SKIPS = Path(__file__).with_name("cfn-lint-skips.yaml")


@dataclass(frozen=True)
class Skip:
    rule: str
    resources: tuple[str, ...]
    reason: str

    def accepts(self, finding: dict[str, Any]) -> bool:
        path = finding["Location"]["Path"]
        resource = str(path[1]) if len(path) > 1 and path[0] == "Resources" else ""
        return finding["Rule"]["Id"] == self.rule and any(
            re.fullmatch(".*".join(map(re.escape, p.split("*"))), resource) for p in self.resources)


def skips(path: Path = SKIPS) -> list[Skip]:
    entries = yaml.safe_load(path.read_text()) or []
    out = []
    for entry in entries:
        if not (entry.get("rule") and entry.get("resources") and str(entry.get("reason", "")).strip()):
            raise ValueError(f"{path.name}: every entry needs a rule, resources and a reason: {entry}")
        out.append(Skip(entry["rule"], tuple(entry["resources"]), entry["reason"]))
    return out


def lint(templates: Sequence[Path], cfn_lint: Path) -> list[dict[str, Any]]:
    done = subprocess.run([str(cfn_lint), "--format", "json", "--", *map(str, templates)], capture_output=True,
                          text=True, timeout=240)
    if done.returncode not in (0, 2, 4, 6, 8, 10, 12, 14) or not done.stdout.strip():  # bit 1: cfn-lint itself failed
        raise RuntimeError(f"cfn-lint failed ({done.returncode}): {done.stderr[-2000:]}")
    return list(json.loads(done.stdout))


def problems(findings: Sequence[dict[str, Any]], accepted: Sequence[Skip]) -> list[str]:
    """What fails the gate: errors, findings no entry accepts, entries no finding matches."""
    out = []
    used: set[Skip] = set()
    for f in findings:
        where = "/".join(map(str, f["Location"]["Path"]))
        covering = [s for s in accepted if s.accepts(f)]
        if f["Level"] == "Error" or not covering:
            out.append(f"{f['Level']} {f['Rule']['Id']} at {where}: {f['Message']}")
        used.update(covering)
    out += [f"{SKIPS.name}: {s.rule} on {list(s.resources)} matches no finding: remove it" for s in accepted
            if s not in used]
    return out


def main(argv: list[str] | None = None) -> int:
    templates = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    findings = lint(templates, Path(sys.executable).with_name("cfn-lint"))
    found = problems(findings, skips())
    print(f"cfn-lint: {len(findings)} findings, {len(findings) - len(found)} accepted by {SKIPS.name}")
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
