"""decide.vend: who gets a job's storage credentials (the proven instance must be one of the live attempt's)
and which keys they reach (only that job's)."""

from __future__ import annotations

import pytest

from jobplane.clouds.base import TAG_ATTEMPT, TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED
from jobplane.decide.vend import Caller, Grant, Refusal, decide, scope
from jobplane.model import keys
from jobplane.model.keys import JobData
from jobplane.model.states import State
from tests.decide.helpers import record

DEPLOYMENT = "reg"


def tags(job: str = "a", attempt: int = 1, deployment: str = DEPLOYMENT) -> dict[str, str]:
    return {TAG_MANAGED: "true", TAG_DEPLOYMENT: deployment, TAG_JOB_ID: job, TAG_ATTEMPT: str(attempt)}


def ask(rec: object, caller: Caller) -> Grant | Refusal:
    return decide(rec, caller, bucket="reg", root="", deployment=DEPLOYMENT)  # type: ignore[arg-type]


def test_an_instance_of_the_live_attempt_gets_its_jobs_keys_only() -> None:
    granted = ask(record("a"), Caller("i-a-1-0", "a", 1, claimed_instance_id="i-a-1-0", tags=tags()))
    assert isinstance(granted, Grant) and granted.job_id == "a" and granted.attempt == 1
    assert granted.scope.read_write == ("teams/default/a/", "heartbeats/a/", "jobs/a/attempts/1/nodes/")
    assert granted.scope.read_write_objects == ("preempted-jobs/a", "jobs/a/attempts/1/boot-failure.json")
    assert granted.scope.read_only == ("system/agent/",)
    # what the agent reads and the functions write: never its to write (tests/vending/test_trusted_keys.py)
    assert granted.scope.read_only_objects == ("jobs/a/job.json", "jobs/a/attempts/1/cluster.json",
                                               "jobs/a/control/stop")
    assert granted.scope.record_folder == "jobs/a/"


def test_a_vm_the_launcher_has_not_recorded_yet_is_known_by_its_tags() -> None:
    launching = record("a", State.LAUNCHING, instances=[])
    assert isinstance(ask(launching, Caller("i-new", "a", 1, tags=tags())), Grant)


@pytest.mark.parametrize(("rec", "caller", "why"), [
    (record("a"), Caller("i-b-1-0", "a", 1, tags=tags("b")), "is not an instance of job a attempt 1"),
    (record("a"), Caller("i-x", "a", 1, tags=tags("a", deployment="other")), "is not an instance of job a"),
    (record("a", attempt=2), Caller("i-a-1-0", "a", 1, tags=tags()), "attempt 1 of job a is over"),
    (record("a", State.SUCCEEDED), Caller("i-a-1-0", "a", 1, tags=tags()), "job a is SUCCEEDED"),
    (record("a", State.PREEMPTED), Caller("i-a-1-0", "a", 1, tags=tags()), "job a is PREEMPTED"),
    (None, Caller("i-a-1-0", "a", 1, tags=tags()), "no job a"),
    (record("a"), Caller("i-unknown", "a", 1, tags=None), "not an instance of this account"),
    (record("a"), Caller("i-b-1-0", "a", 1, claimed_instance_id="i-a-1-0", tags=tags("b")), "names instance i-a-1-0"),
])
def test_refused(rec: object, caller: Caller, why: str) -> None:
    refused = ask(rec, caller)
    assert isinstance(refused, Refusal) and why in refused.why, refused


def test_the_scope_follows_the_root_and_names_the_code_bundle_as_one_object() -> None:
    granted = scope("reg", "team-x/", JobData("a", "team"), 2, "team-x/code/team/a.tar.gz")
    assert granted.read_write == ("team-x/teams/team/a/", "team-x/heartbeats/a/", "team-x/jobs/a/attempts/2/nodes/")
    assert granted.read_only == ("team-x/system/agent/",)
    assert granted.read_only_objects[-1] == "team-x/code/team/a.tar.gz"
    assert scope("reg", "", JobData("a", "team"), 1).read_only_objects[-1] == "jobs/a/control/stop"
    # a job recorded before its data moved under teams/: its data areas, never its whole record's folder
    legacy = scope("reg", "", JobData("a"), 1)
    assert legacy.read_write[:6] == tuple(f"jobs/a/{area}" for area in keys.DATA_AREAS)
    assert "jobs/a/" not in legacy.read_write and legacy.read_only == ("jobs/a/code/", "system/agent/")
    # the code bundle a record names, as decide finds it (decide.vend.code_object; tests/vending/test_vend_code.py)
    own = ask(record("a", owner="team", code="s3://reg/code/team/a.tar.gz"), Caller("i-a-1-0", "a", 1, tags=tags()))
    assert isinstance(own, Grant) and own.scope.read_only_objects[-1] == "code/team/a.tar.gz"
    elsewhere = ask(record("a", code="s3://datasets/code.tar.gz"), Caller("i-a-1-0", "a", 1, tags=tags()))
    assert isinstance(elsewhere, Grant) and elsewhere.scope.read_only_objects[-1] == "jobs/a/control/stop"
