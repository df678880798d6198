"""checkov, a scanner we did not write, over the session's synthesized template (the one every infra test reads)
and infra/gcp, held to infra/checkov-skips.yaml by infra/checkov_gate.py: `make checkov` over `make synth`'s
template, without a synth of its own (one synth less in `make test`, about 9 CPU seconds)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.infra.conftest import ROOT, Synth

pytestmark = [pytest.mark.infra, pytest.mark.timeout(600)]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"  # its own venv (infra/checkov-requirements.txt says why)


def test_checkov_finds_nothing_the_skip_file_does_not_accept(synth: Synth) -> None:
    if not CHECKOV.exists():
        pytest.skip(f"no {CHECKOV.relative_to(ROOT)}: `make test` installs it (make .venv-checkov/.installed)")
    done = subprocess.run([sys.executable, "-m", "infra.checkov_gate", "--checkov", str(CHECKOV),
                           "--template", str(synth.outdir / "Jobplane.template.json"),
                           "--terraform", str(ROOT / "infra" / "gcp")],
                          cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "checkov cloudformation:" in done.stdout and "checkov terraform:" in done.stdout, done.stdout
