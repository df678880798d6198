"""`jobplane ssh`'s choices (jobplane.shell): which VM, and the command that opens the way in per cloud."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from jobplane.registry import JobRecord
from jobplane.shell import ShellError, iap_argv, ssm_argv, target
from jobplane.spec import parse_spec
from jobplane.states import State


def record(state: State, instances: list[str]) -> JobRecord:
    spec = parse_spec("instance_type: m5.large\nnum_nodes: 2\nrun: python3 t.py\n")
    now = datetime(2026, 11, 25, tzinfo=UTC)
    return JobRecord(id="j1", spec=spec, state=state, attempt=2, instances=instances, created_at=now, updated_at=now,
                     state_since=now)


def test_the_rank_names_a_vm_of_the_current_attempt() -> None:
    assert target(record(State.RUNNING, ["i-0a", "i-0b"]), 1) == "i-0b"
    with pytest.raises(ShellError, match="has ranks 0 to 1, not 2"):
        target(record(State.RUNNING, ["i-0a", "i-0b"]), 2)
    with pytest.raises(ShellError, match="is SUCCEEDED: its VMs are gone"):
        target(record(State.SUCCEEDED, ["i-0a", "i-0b"]), 0)
    with pytest.raises(ShellError, match="no VM yet"):
        target(record(State.LAUNCHING, []), 0)


def test_aws_goes_through_session_manager_and_gcp_through_iap() -> None:
    assert ssm_argv("i-0a", "eu-west-1", []) == ["aws", "ssm", "start-session", "--target", "i-0a",
                                                 "--region", "eu-west-1"]
    one = ssm_argv("i-0a", None, ["nvidia-smi", "-L"])
    assert one[:5] == ["aws", "ssm", "start-session", "--target", "i-0a"]
    assert one[5:7] == ["--document-name", "AWS-StartInteractiveCommand"]
    assert json.loads(one[8]) == {"command": ["nvidia-smi -L"]}
    assert iap_argv("us-central1-a/jobplane-abc123-j1-a2-0001", "proj", ["echo", "ok"]) == [
        "gcloud", "compute", "ssh", "jobplane-abc123-j1-a2-0001", "--zone", "us-central1-a", "--tunnel-through-iap",
        "--project", "proj", "--command", "echo ok"]
