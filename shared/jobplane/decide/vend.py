"""Who may hold a job's storage credentials, and what they cover: the pure half of the credential vending
functions (AWS: functions/aws/vend.py; GCP: the `vend` entry point of functions/gcp/main.py).

A VM's own identity may only ask. The cloud proves who is asking (AWS: the STS identity of the instance
role's session, whose name is the instance id; GCP: the instance id inside a Google-signed identity token),
and `decide` answers from the job's record and the cloud's own tags on that instance (a VM cannot change its
tags): credentials limited to that job's keys (`scope`) for the attempt the VM serves, while it is live.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from jobplane.clouds.base import TAG_ATTEMPT, TAG_DEPLOYMENT, TAG_JOB_ID, TAG_MANAGED, Scope
from jobplane.model import keys
from jobplane.model.states import State

# An agent serves a job from its first heartbeat to its exit report; the launcher may not have recorded the
# VM yet when it asks (the tags say whose it is then). Any other state has no agent that needs to write.
LIVE_FOR_AGENTS = frozenset({State.LAUNCHING, State.RUNNING})
# Short enough that a finished attempt's VM loses access soon, long enough that a refresh is rare.
CREDENTIAL_SECONDS = 3600
# A code bundle's name under code/<owner>/: path segments of these characters. Bounded so that the AWS session
# policy naming it stays under AWS's size limit (vending.aws_iam.worst_case_policy_size: the synth's check).
MAX_CODE_NAME = 128
_CODE_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


class _Spec(Protocol):
    @property
    def owner(self) -> str: ...

    @property
    def code(self) -> str | None: ...

    @property
    def secret_names(self) -> tuple[str, ...]: ...


class Job(Protocol):
    """What a grant is decided on: a JobRecord, or the JobFacts a vend function reads (jobplane.model.jobfacts)."""

    @property
    def data(self) -> keys.JobData: ...

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def attempt(self) -> int: ...

    @property
    def instances(self) -> Sequence[str]: ...

    @property
    def spec(self) -> _Spec: ...


@dataclass(frozen=True)
class Caller:
    """An agent's request. `instance_id` is what the cloud proved; the rest is what the request says."""

    instance_id: str
    job_id: str
    attempt: int
    claimed_instance_id: str | None = None  # the id the request body names, if any: must equal the proven one
    tags: Mapping[str, str] | None = None  # the cloud's tags (GCE labels) on the proven instance; None: not found


@dataclass(frozen=True)
class Grant:
    job_id: str
    attempt: int
    instance_id: str
    scope: Scope
    seconds: int = CREDENTIAL_SECONDS


@dataclass(frozen=True)
class Refusal:
    why: str


def code_object(code: str | None, *, bucket: str, root: str, owner: str,
                data: keys.JobData | None) -> str | Refusal | None:
    """The one registry object a job's credentials must read its code from; None when they need none; or why
    the spec's `code:` names registry keys that are not the job's to read.

    None: no `code:` (the agent reads code/code.tar.gz in the job's data folder), code in another bucket (the VM's
    own identity reads it: the platform's data buckets), or code under the job's own code/ (its data folder's,
    keys.JobData: its credentials reach it already). The object: a tarball under its owner's code/<owner>/, where
    `submit --code` uploads (a sweep's trials share the sweep's). Anything else in the registry's bucket is refused:
    the code/ folder, another owner's bundles, another job's or the control plane's keys, another root's. data
    None: a sweep's spec, whose trials each have keys of their own."""
    if not code:
        return None
    try:
        code_bucket, key = keys.split_uri(code)
    except ValueError as exc:
        return Refusal(str(exc))
    if code_bucket != bucket:
        return None
    base = keys.root_prefix(root)
    own, folder = (base + keys.code_prefix(data) if data else None), base + keys.code_folder(owner)
    if own and key.startswith(own):
        return None
    where = f"{folder}<name>.tar.gz" + (f" or under {own}" if own else " (a sweep's trials each have their own keys)")
    if not key.startswith(folder):
        return Refusal(f"{code} is in the registry but is not this job's own code: give {where}, where "
                       f"`jobplane submit --code` uploads it")
    name = key[len(folder):]
    if (not _CODE_NAME.fullmatch(name) or {".", ".."} & set(name.split("/"))
            or not name.endswith(keys.TARBALL_SUFFIXES)):
        return Refusal(f"{code}: a code bundle in the registry is one tarball ({', '.join(keys.TARBALL_SUFFIXES)}) "
                       f"named with letters, digits, '.', '_', '-' and '/': {where}")
    if len(name) > MAX_CODE_NAME:
        return Refusal(f"{code}: its name after {folder} is {len(name)} characters, over {MAX_CODE_NAME} (the "
                       f"job's credentials must stay within AWS's session policy size)")
    return key


def scope(bucket: str, root: str, data: keys.JobData, attempt: int, code: str | None = None,
          secrets: tuple[str, ...] = (), owner: str = "") -> Scope:
    """What the job's agents write, and nothing the control plane decides on: its data folder (logs, metrics, system
    samples, TensorBoard files, checkpoints, artifacts), its heartbeats, the attempt's exit reports and boot failure,
    its preempted marker. Read-only: its record, the attempt's cluster.json, its stop request, the agent bundles and
    its code bundle's one object (`code_object`). Never its record, events, admission records or any other key the
    functions trust for identity, scope or money (tests/vending/test_trusted_keys.py). Input data comes from the
    platform's data buckets, not from here. secrets: the names of its owner's secrets its spec reads, and no other
    (read only)."""
    base = keys.root_prefix(root)
    job = data.job_id
    return Scope(bucket=bucket,
                 read_write=tuple(base + p for p in (*keys.data_prefixes(data), keys.heartbeats_prefix(job),
                                                     keys.exits_prefix(job, attempt))),
                 read_write_objects=(base + keys.preempted_marker(job), base + keys.boot_failure(job, attempt)),
                 # a job recorded before keeps its code in its record's folder (in teams/, it is among the above)
                 read_only=((base + keys.code_prefix(data),) if data.owner is None else ()) + (base + keys.AGENT,),
                 read_only_objects=tuple(base + k for k in (keys.job_record(job), keys.cluster(job, attempt),
                                                            keys.stop_request(job))) + ((code,) if code else ()),
                 record_folder=base + keys.job_prefix(job), secret_owner=owner if secrets else "", secrets=secrets)


def decide(record: Job | None, caller: Caller, *, bucket: str, root: str, deployment: str) -> Grant | Refusal:
    """Credentials for `caller`'s job, or why not. Refused: a body naming another instance than the one the
    cloud proved, an unknown job, a job or attempt that is over, an instance that is not one of the attempt's
    (neither recorded at launch nor tagged by this deployment for this job and attempt), a `code:` that is not
    the job's own (`code_object`: a record accepted before the launcher checked it)."""
    if caller.claimed_instance_id is not None and caller.claimed_instance_id != caller.instance_id:
        return Refusal(f"the request names instance {caller.claimed_instance_id} but was signed by "
                       f"{caller.instance_id}")
    if caller.tags is None:
        return Refusal(f"{caller.instance_id} is not an instance of this account and region")
    if record is None:
        return Refusal(f"no job {caller.job_id}")
    if record.state not in LIVE_FOR_AGENTS:
        return Refusal(f"job {record.id} is {record.state.value}: no agent of it may write")
    if caller.attempt != record.attempt:
        return Refusal(f"attempt {caller.attempt} of job {record.id} is over (the job is on attempt {record.attempt})")
    tags = caller.tags
    tagged = (tags.get(TAG_MANAGED) == "true" and tags.get(TAG_DEPLOYMENT) == deployment
              and tags.get(TAG_JOB_ID) == record.id and tags.get(TAG_ATTEMPT) == str(record.attempt))
    if caller.instance_id not in record.instances and not tagged:
        return Refusal(f"{caller.instance_id} is not an instance of job {record.id} attempt {record.attempt}")
    code = code_object(record.spec.code, bucket=bucket, root=root, owner=record.spec.owner, data=record.data)
    if isinstance(code, Refusal):
        return Refusal(f"job {record.id}'s code: {code.why}")
    return Grant(record.id, record.attempt, caller.instance_id,
                 scope(bucket, root, record.data, record.attempt, code, record.spec.secret_names, record.spec.owner))
