"""The CLI's pure parts and its one-line errors (no cloud needed)."""

from __future__ import annotations

import re
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from jobplane.cli import cli
from jobplane.local.runner import parse_power
from jobplane.model.keys import JOB_ID_PATTERN
from jobplane.ops.jobs import make_bundle
from jobplane.views.jobview import display, human_duration, readable_job_id, rejected_reason, rejected_row

NOW = datetime(2026, 11, 22, 11, 30, 5, tzinfo=UTC)


def test_generated_job_ids_are_readable_and_valid():
    for name in ("My Model v2", "9 lives", "---", "x" * 100, "ÜBER_net"):
        job_id = readable_job_id(name, NOW, "ab12")
        assert re.match(JOB_ID_PATTERN, job_id), job_id
        assert job_id.endswith("-1122-113005-ab12")
    assert readable_job_id("My Model v2", NOW, "ab12") == "my-model-v2-1122-113005-ab12"


def test_human_durations():
    assert [human_duration(s) for s in (None, 5, 65, 3700, 90000)] == ["-", "5s", "1m05s", "1h01m", "1d01h"]


def test_rejected_row_names_the_fields():
    doc = {"errors": [{"field": "run", "message": "required field is missing"},
                      {"field": "num_nodes", "message": "Input should be greater than or equal to 1"}]}
    row = rejected_row("bad", doc, NOW - timedelta(seconds=30), NOW)
    assert row["state"] == "INVALID" and row["age"] == 30
    assert row["reason"] == "run: required field is missing; num_nodes: Input should be greater than or equal to 1"
    assert display(row)[:3] == ["bad", "INVALID", "0"]
    assert rejected_reason({"reason": "duplicate id"}) == "duplicate id"


def test_code_bundle_skips_caches(tmp_path: Path):
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "m.py").write_text("")
    (src / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    out = tmp_path / "code.tar.gz"
    assert make_bundle(src, out) == 2
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/m.py", "train.py"]


def test_shutdown_shim_records_follow_systemd():
    assert parse_power("100 poweroff ") == ("halt", 100)
    assert parse_power("100 shutdown -h now") == ("halt", 100)
    assert parse_power("100 shutdown -h +5 jobplane: uptime cap") == ("halt", 400)
    assert parse_power("100 shutdown -h") == ("halt", 160)
    assert parse_power("100 shutdown -c") == ("cancel", None)
    assert parse_power("garbage") is None


def test_errors_are_one_line_without_traceback(monkeypatch):
    monkeypatch.delenv("JOBPLANE_BUCKET", raising=False)
    result = CliRunner().invoke(cli, ["ls"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: no registry bucket: set JOBPLANE_BUCKET or pass --bucket "
                                     "(s3://BUCKET or gs://BUCKET)")
    result = CliRunner().invoke(cli, ["local", "preempt", "j", "--state-dir", "/nonexistent-jobplane"])
    assert result.exit_code == 1 and "no local cloud running" in result.output and "Traceback" not in result.output


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    commands = [[], ["submit"], ["ls"], ["describe"], ["logs"], ["metrics"], ["wait"], ["cancel"], ["cost"],
                ["validate"], ["schema"], ["local"], ["local", "up"], ["local", "preempt"], ["local", "kill"],
                ["local", "instance"], ["local", "status"], ["local", "pause"]]
    for command in commands:
        result = runner.invoke(cli, [*command, "--help"])
        assert result.exit_code == 0, command
        assert "jobplane " in result.output.split("Options:")[0] and ("Example" in result.output
                                                                       or "Quick start" in result.output), command
