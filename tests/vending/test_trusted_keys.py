"""What a job's credentials can write, against everything the functions read (issue 57): every kind of registry key,
with what it decides, and on each cloud whether a job's own credentials may write it, evaluated as the local clouds
evaluate them (AWS: the job role and the session policy vend gives, by jobplane.local.iam_policy, what the local
moto enforces; GCP: the Credential Access Boundary vend asks for, by jobplane.local.fake_sts, what the GCS fake
enforces). A job writes exactly its agents' facts: none decides identity, scope or money, each only its own job's
outcome. A day on the manual clock shows the table covers every key the functions read."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import pytest

from jobplane.clouds.base import Blob, ObjectInfo, Scope
from jobplane.clouds.gcs_downscope import boundary
from jobplane.clouds.memory import Clock, MemoryStore
from jobplane.decide.vend import scope
from jobplane.local import fake_sts, iam_policy
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.vending import aws_iam
from tests.control.reconcile.day import Day, new_day

BUCKET, OWNER, JOB, OTHER = "reg", "team-a", "j", "k"
DATA, OTHER_DATA = keys.JobData(JOB, OWNER), keys.JobData(OTHER, "team-b")
WHEN = keys.stamp(datetime(2026, 11, 22, tzinfo=UTC), "ab12")


class Decides(StrEnum):
    """What the functions decide on a kind of key."""

    TRUST = "identity, scope, money or state"  # the control plane's own: never a job's to write
    FACT = "its own job's outcome"  # what the job's agents report of it (checked against the attempt's instances)
    DATA = "nothing"  # the job's own data, read for people (and a sweep's objective, of its own trial)


@dataclass(frozen=True)
class Kind:
    name: str
    builder: str  # the keys.py function (or constant) that builds it
    example: str  # one such key: of job j, owner team-a, attempt 1, rank 0
    decides: Decides
    shape: str  # every such key, of any job, owner, attempt and rank (a regular expression)


NAME, N = r"[^/]+", r"[0-9]+"  # a name (a job, an owner, a sweep), a number (an attempt, a rank)
T = rf"teams/{NAME}/{NAME}/"  # a job's data folder
KINDS = [
    Kind("job record", "job_record", keys.job_record(JOB), Decides.TRUST, rf"jobs/{NAME}/job\.json"),
    Kind("event", "event", keys.event(JOB, WHEN, "created"), Decides.TRUST, rf"jobs/{NAME}/events/{NAME}\.json"),
    Kind("active marker", "active_marker", keys.active_marker(JOB, State.RUNNING, 1), Decides.TRUST,
         rf"active/{NAME}/[A-Z_]+\.{N}(\..*)?"),
    Kind("idle flag", "idle_flag", keys.idle_flag(JOB, 1), Decides.TRUST, rf"active/{NAME}\.{N}\.idle-flagged"),
    Kind("held mark", "held_mark", keys.held_mark(JOB, 1, datetime(2026, 11, 23, tzinfo=UTC)), Decides.TRUST,
         rf"active/{NAME}\.{N}\.held-until-{N}"),
    Kind("limits mark", "limits_mark", keys.limits_mark(JOB, 1, 1, 60, 60), Decides.TRUST,
         rf"limits/{NAME}/{N}/{NAME}"),
    Kind("cluster", "cluster", keys.cluster(JOB, 1), Decides.TRUST, rf"jobs/{NAME}/attempts/{N}/cluster\.json"),
    Kind("ignored flag", "ignored_flag", keys.ignored_flag(JOB, 1, keys.exit_report(JOB, 1, 0)), Decides.TRUST,
         rf"jobs/{NAME}/attempts/{N}/ignored/{NAME}"),
    Kind("stop request", "stop_request", keys.stop_request(JOB), Decides.TRUST, rf"jobs/{NAME}/control/stop"),
    Kind("queue drop", "queue_entry", keys.queue_entry(JOB, OWNER), Decides.TRUST, rf"queue/({NAME}/)?{NAME}"),
    Kind("rejected spec", "rejected_spec", keys.rejected_spec(JOB), Decides.TRUST,
         r"rejected/[^/.]+\.(yaml|yml|json)"),
    Kind("rejected error", "rejected_error", keys.rejected_error(JOB), Decides.TRUST, rf"rejected/{NAME}\.error\.json"),
    Kind("cancel request", "cancel_request", keys.cancel_request(OWNER, JOB), Decides.TRUST, rf"cancels/{NAME}/{NAME}"),
    Kind("code upload", "code_upload", keys.code_upload(OWNER, JOB), Decides.TRUST,  # what a grant may read
         rf"code/{NAME}/.+"),
    Kind("owner's admission", "admission_owner", keys.admission_owner(OWNER), Decides.TRUST,
         rf"admission/owners/{NAME}\.json"),
    Kind("deployment's admission", "ADMISSION_DEPLOYMENT", keys.ADMISSION_DEPLOYMENT, Decides.TRUST,
         r"admission/deployment\.json"),
    Kind("family's admission", "admission_family", keys.admission_family("p4d"), Decides.TRUST,
         rf"admission/families/{NAME}\.json"),
    Kind("budget notice", "budget_notice", keys.budget_notice("2026-11", OWNER, "warning"), Decides.TRUST,
         rf"budget-notices/{NAME}/{NAME}"),
    Kind("waiting mark", "waiting_for", keys.waiting_for(OTHER, JOB), Decides.TRUST, rf"after/{NAME}/{NAME}"),
    Kind("sweep record", "sweep_record", keys.sweep_record(JOB), Decides.TRUST, rf"sweeps/{NAME}/sweep\.json"),
    Kind("sweep curve", "sweep_curve", keys.sweep_curve(JOB, JOB + "-t001"), Decides.TRUST,
         rf"sweeps/{NAME}/curves/{NAME}\.json"),
    Kind("active sweep", "active_sweep", keys.active_sweep(JOB), Decides.TRUST, rf"active-sweeps/{NAME}"),
    Kind("policy", "POLICY", keys.POLICY, Decides.TRUST, r"config/policy\.yaml"),
    Kind("agent bundle", "agent_file", keys.agent_file("manifest.json"), Decides.TRUST, r"system/agent/.+"),
    Kind("exit report", "exit_report", keys.exit_report(JOB, 1, 0), Decides.FACT,
         rf"jobs/{NAME}/attempts/{N}/nodes/{NAME}/exit\.json"),
    Kind("boot failure", "boot_failure", keys.boot_failure(JOB, 1), Decides.FACT,
         rf"jobs/{NAME}/attempts/{N}/boot-failure\.json"),
    Kind("heartbeat", "heartbeat", keys.heartbeat(JOB, 1, 0), Decides.FACT, rf"heartbeats/{NAME}/{N}/{N}"),
    Kind("output mark", "output_mark", keys.output_mark(JOB, 1, 0), Decides.FACT,
         rf"heartbeats/{NAME}/{N}/{N}\.output"),
    Kind("idle mark", "idle_mark", keys.idle_mark(JOB, 1, 0), Decides.FACT, rf"heartbeats/{NAME}/{N}/{N}\.idle"),
    Kind("preempted marker", "preempted_marker", keys.preempted_marker(JOB), Decides.FACT, rf"preempted-jobs/{NAME}"),
    Kind("log chunk", "log_chunk", keys.log_chunk(DATA, 1, 0, 0), Decides.DATA, rf"{T}logs/{N}/{N}/{N}\.log"),
    Kind("console log", "console_log", keys.console_log(DATA, 1, 0), Decides.DATA, rf"{T}logs/{N}/{N}/console\.log"),
    Kind("metrics chunk", "metrics_chunk", keys.metrics_chunk(DATA, 1, 0, 0), Decides.DATA,
         rf"{T}metrics/{N}/{N}/{N}\.jsonl"),
    Kind("system chunk", "system_chunk", keys.system_chunk(DATA, 1, 0, 0), Decides.DATA,
         rf"{T}system/{N}/{N}/{N}\.jsonl"),
    Kind("event file", "tensorboard_prefix", keys.tensorboard_prefix(DATA, 1, 0) + "events.out", Decides.DATA,
         rf"{T}tensorboard/.+"),
    Kind("checkpoint", "checkpoints_prefix", keys.checkpoints_prefix(DATA) + "manifests/0/1.json", Decides.DATA,
         rf"{T}checkpoints/.+"),
    Kind("artifact", "artifacts_prefix", keys.artifacts_prefix(DATA) + "model.manifest.json", Decides.DATA,
         rf"{T}artifacts/.+"),
    Kind("code bundle", "code_bundle", keys.code_bundle(DATA), Decides.DATA, rf"{T}code/.+"),
]
# keys.py's functions that build no key of their own: prefixes of the kinds above, and helpers
NOT_KINDS = {"active_prefix", "attempt_prefix", "code_folder", "code_prefix", "data_prefixes", "events_prefix",
             "exits_prefix", "heartbeats_prefix", "job_named_by", "job_prefix", "limits_tail", "logs_prefix",
             "metrics_prefix", "node_prefix", "of_job", "root_prefix", "split_uri", "stamp", "system_prefix",
             "team_folder"}


def of_kind(key: str) -> Kind | None:
    """The one kind a key is, if any."""
    found = [kind for kind in KINDS if re.fullmatch(kind.shape, key)]
    assert len(found) <= 1, (key, [k.name for k in found])
    return found[0] if found else None


def granted(job: keys.JobData = DATA) -> Scope:
    """The scope vend grants attempt 1 of the job (a code bundle of its owner's named)."""
    return scope(BUCKET, "", job, 1, keys.code_upload(job.owner or OWNER, job.job_id))


def aws_writes(key: str, grant: Scope) -> bool:
    role = aws_iam.document(aws_iam.job_role_statements(aws_iam.bucket_arn("aws", BUCKET), ""))
    session = aws_iam.session_policy(grant, "aws")
    return any(iam_policy.session_allows([role], session, action, f"arn:aws:s3:::{BUCKET}/{key}")
               for action in ("s3:PutObject", "s3:DeleteObject"))


def gcp_writes(key: str, grant: Scope) -> bool:
    rules = tuple(fake_sts.parse_rule(r) for r in boundary(grant)["accessBoundary"]["accessBoundaryRules"])
    return any(fake_sts.allowed(rules, permission, BUCKET, key) for permission in ("create", "delete"))


CLOUDS: dict[str, Callable[[str, Scope], bool]] = {"aws": aws_writes, "gcp": gcp_writes}


def test_every_kind_of_key_keys_py_builds_is_in_the_table() -> None:
    builders = {name for name, fn in inspect.getmembers(keys, inspect.isfunction)
                if fn.__module__ == keys.__name__ and not name.startswith(("_", "parse_"))}
    assert builders - NOT_KINDS <= {kind.builder for kind in KINDS}, "say what a new kind of key decides"
    assert {kind.name for kind in KINDS if of_kind(kind.example) is not kind} == set()


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_jobs_credentials_write_its_agents_facts_and_data_and_nothing_the_functions_trust(cloud: str) -> None:
    writes = CLOUDS[cloud]
    writable = {kind.name for kind in KINDS if writes(kind.example, granted())}
    # on AWS a VM's bootstrap reports a failed boot through a URL the launcher presigned, not these credentials
    by_url = {"boot failure"} if cloud == "aws" else set()
    assert writable == {kind.name for kind in KINDS if kind.decides != Decides.TRUST} - by_url, cloud
    # and no key of another job, its facts and data included
    others = [k.example.replace(f"/{JOB}/", f"/{OTHER}/").replace(keys.team_folder(OWNER), keys.team_folder("team-b"))
              .replace(f"/{JOB}", f"/{OTHER}") for k in KINDS if k.decides != Decides.TRUST]
    assert [key for key in others if writes(key, granted())] == []
    # a job recorded before its data moved under teams/ writes its data areas, never its record's folder whole
    legacy = granted(keys.JobData(JOB))
    assert writes(keys.log_chunk(keys.JobData(JOB), 1, 0, 0), legacy)
    assert not any(writes(key, legacy) for key in (keys.job_record(JOB), keys.event(JOB, WHEN, "created"),
                                                   keys.cluster(JOB, 1), keys.stop_request(JOB)))


class Recording(MemoryStore):
    """A MemoryStore that remembers every key read and every prefix listed."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.read: set[str] = set()

    def get(self, key: str) -> Blob:
        self.read.add(key)
        return super().get(key)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        found = list(super().list(prefix, page_size))
        self.read.update(info.key for info in found)
        return iter(found)


def test_every_key_the_functions_read_over_a_day_is_a_kind_of_the_table() -> None:
    day: Day = new_day(Recording)
    store = day.store
    assert isinstance(store, Recording)
    day.started("plain", "max_restarts: 2\nspot: true\n")
    day.preempted("plain")
    day.rerun()
    day.clock.advance(60)
    day.beat("plain")
    day.sweeper()
    day.exits("plain", 0, 0)
    day.sweeper(jobs=["plain"])
    day.submit("sweep", "sweep: {parameters: {lr: {uniform: [0.1, 1.0]}}, max_trials: 2, max_parallel: 1,"
                        " objective: {metric: loss, goal: minimize}}\n")
    day.backstop()
    day.clock.advance(600)
    day.sweeper()
    unknown = sorted(key for key in store.read if of_kind(key) is None)
    assert unknown == []
    assert {"job record", "exit report", "heartbeat", "preempted marker", "sweep record", "policy"} <= {
        kind.name for key in store.read if (kind := of_kind(key))}
