"""checkov, a scanner we did not write, over the session's synthesized template (the one every infra test reads)
and infra/gcp, held to infra/checkov-skips.yaml by infra/checkov_gate.py: `make checkov` over `make synth`'s
template, without a synth of its own (one synth less in `make test`, about 9 CPU seconds)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.infra.conftest import ROOT, Synth
from tests.infra.kept import kept

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"  # its own venv (infra/checkov-requirements.txt says why)


def test_checkov_finds_nothing_the_skip_file_does_not_accept(synth: Synth) -> None:
    if not CHECKOV.exists():
        pytest.skip(f"no {CHECKOV.relative_to(ROOT)}: `make test` installs it (make .venv-checkov/.installed)")
    template = synth.outdir / "Jobplane.template.json"

    def gate() -> list[Any]:
        done = subprocess.run([sys.executable, "-m", "infra.checkov_gate", "--checkov", str(CHECKOV),
                               "--template", str(template), "--terraform", str(ROOT / "infra" / "gcp")],
                              cwd=ROOT, capture_output=True, text=True, timeout=480)
        return [done.returncode, done.stdout, done.stderr[-3000:]]

    # the verdict over these inputs and this checkov (its venv's packages), as a run kept it (tests/infra/kept.py)
    installed = sorted(p.name for p in (CHECKOV.parents[1] / "lib").glob("python*/site-packages/*.dist-info"))
    code, out, err = kept("checkov", [template, ROOT / "infra" / "gcp", ROOT / "infra" / "checkov-skips.yaml",
                                      ROOT / "infra" / "checkov_gate.py", *installed], gate)
    assert code == 0, out + err
    assert "checkov cloudformation:" in out and "checkov terraform:" in out, out
