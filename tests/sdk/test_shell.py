"""`jobplane ssh`'s choices (jobplane.sdk.shell): which VM, and the command that opens the way in per cloud."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from jobplane.model.jobrecord import JobRecord
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.sdk.shell import ShellError, iap_argv, ssm_argv, target

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def record(state: State, instances: list[str], held_until: datetime | None = None) -> JobRecord:
    spec = parse_spec("instance_type: m5.large\nnum_nodes: 2\nrun: python3 t.py\n")
    return JobRecord(id="j1", spec=spec, state=state, attempt=2, instances=instances, created_at=NOW, updated_at=NOW,
                     state_since=NOW, held_until=held_until)


def test_the_rank_names_a_vm_of_the_current_attempt() -> None:
    assert target(record(State.RUNNING, ["i-0a", "i-0b"]), 1, NOW) == "i-0b"
    with pytest.raises(ShellError, match="has ranks 0 to 1, not 2"):
        target(record(State.RUNNING, ["i-0a", "i-0b"]), 2, NOW)
    with pytest.raises(ShellError, match="is SUCCEEDED: its VMs are gone"):
        target(record(State.SUCCEEDED, ["i-0a", "i-0b"]), 0, NOW)
    with pytest.raises(ShellError, match="no VM yet"):
        target(record(State.LAUNCHING, []), 0, NOW)


def test_a_failed_job_s_vms_are_reachable_while_its_debug_hold_lasts() -> None:
    held = record(State.FAILED, ["i-0a", "i-0b"], held_until=NOW + timedelta(minutes=30))
    assert target(held, 1, NOW + timedelta(minutes=29)) == "i-0b"
    with pytest.raises(ShellError, match=r"is FAILED: its VMs are gone\Z"):
        target(held, 1, NOW + timedelta(minutes=30))
    with pytest.raises(ShellError, match="debug_hold: 30m"):  # the hint, where no hold was asked for
        target(record(State.FAILED, ["i-0a", "i-0b"]), 0, NOW)


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
