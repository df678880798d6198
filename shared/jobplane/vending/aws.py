"""The AWS credential vending function's work (functions/aws/vend.py is its thin handler): read the request,
learn from STS who signed its proof, check that identity is this deployment's VM role, look up the instance's
tags and the job's record, let `decide.vend` answer, and mint credentials narrowed to the job's keys.

Answers (a function URL's JSON body): 200 {AccessKeyId, SecretAccessKey, SessionToken, Expiration}; 403
{"refused": why}, final for the agent (CredentialsRefused), also for a grant AWS would refuse (a session policy
over its size limit); 400 {"error", "field"} for a request that does not parse; 503 {"error"} when STS or EC2
did not answer (the agent tries again). Every decision is logged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from jobplane.clouds.base import ProofRejected, VendUnavailable
from jobplane.decide.vend import Caller, Grant, decide
from jobplane.model import keys
from jobplane.model.jobfacts import JobFacts
from jobplane.store.registry import JobNotFound, UnreadableRecord, read_job_facts
from jobplane.store.rooted import RootedStore
from jobplane.vending import aws_iam

MAX_BODY = 64 * 1024
# arn:<partition>:iam::<account>:role[/path]/<name>  and  arn:<partition>:sts::<account>:assumed-role/<name>/<session>
_ROLE = re.compile(r"^arn:([a-z-]+):iam::(\d{12}):role/(?:[^/]+/)*([^/]+)$")
_ASSUMED = re.compile(r"^arn:([a-z-]+):sts::(\d{12}):assumed-role/([^/]+)/([^/]+)$")


@dataclass(frozen=True)
class VendSettings:
    """What the function is deployed with (its handler reads them from the environment)."""

    bucket: str
    root: str
    deployment: str
    vm_role_arn: str  # whose sessions may ask (EC2 names each after its instance)
    job_role_arn: str  # what every grant assumes, narrowed by the session policy

    @property
    def partition(self) -> str:
        return self.vm_role_arn.split(":", 2)[1]


class VendCloud(Protocol):
    """The cloud calls (jobplane.clouds.aws_vend.VendAws)."""

    def caller_arn(self, body: Any) -> str:
        """Who signed the proof, as STS says; raises ProofRejected or VendUnavailable."""
        ...

    def instance_tags(self, instance_id: str) -> dict[str, str] | None: ...

    def credentials(self, role_arn: str, session_name: str, policy: str, seconds: int) -> dict[str, str]: ...


class Log(Protocol):
    """A logger: the stdlib's, or the functions' Powertools Logger (structured `extra`)."""

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None: ...

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None: ...


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Ask:
    job_id: str
    attempt: int
    instance_id: str | None
    proof: dict[str, Any]


class BadRequest(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def parse(body: str | bytes) -> Ask:
    """The request's fields, or BadRequest naming the first one wrong."""
    if len(body) > MAX_BODY:
        raise BadRequest("body", f"over {MAX_BODY} bytes")
    try:
        data = json.loads(body or b"")
    except ValueError:
        raise BadRequest("body", "not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body", "not a JSON object")
    job_id, attempt, instance, proof = (data.get(k) for k in ("job_id", "attempt", "instance_id", "proof"))
    if not isinstance(job_id, str) or not re.match(keys.JOB_ID_PATTERN, job_id):
        raise BadRequest("job_id", "missing, or not a job id")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise BadRequest("attempt", "missing, or not a positive integer")
    if instance is not None and (not isinstance(instance, str) or not instance or len(instance) > 64):
        raise BadRequest("instance_id", "not an instance id")
    if not isinstance(proof, dict):
        raise BadRequest("proof", "missing, or not an object")
    return Ask(job_id, attempt, instance, proof)


def session_name(job_id: str, attempt: int) -> str:
    """The job role session's name, in CloudTrail beside every request made with the credentials."""
    return f"{job_id}-a{attempt}"[:64]


def vend(body: str | bytes, settings: VendSettings, cloud: VendCloud, registry: RootedStore,
         log: Log) -> Answer:
    try:
        ask = parse(body)
    except BadRequest as exc:
        log.info("vend: bad request", extra={"field": exc.field, "problem": str(exc)})
        return Answer(400, {"error": str(exc), "field": exc.field})
    where = {"job_id": ask.job_id, "attempt": ask.attempt, "claimed_instance_id": ask.instance_id}
    try:
        arn = cloud.caller_arn(ask.proof)
    except ProofRejected as exc:
        return _refused(log, where, f"identity proof rejected: {exc}")
    except VendUnavailable as exc:
        log.warning("vend: STS unavailable", extra={**where, "problem": str(exc)})
        return Answer(503, {"error": str(exc)})
    instance_id = _vm_instance(arn, settings.vm_role_arn)
    if instance_id is None:
        return _refused(log, {**where, "caller": arn}, f"{arn} is not a session of this deployment's VM role")
    where |= {"caller": arn, "instance_id": instance_id}
    try:
        tags = cloud.instance_tags(instance_id)
        record: JobFacts | None = read_job_facts(registry, ask.job_id)
    except JobNotFound:
        record = None
    except UnreadableRecord as exc:
        return _refused(log, where, f"job {ask.job_id}'s record does not parse: {exc.problem[:200]}")
    verdict = decide(record, Caller(instance_id, ask.job_id, ask.attempt, ask.instance_id, tags),
                     bucket=settings.bucket, root=settings.root, deployment=settings.deployment)
    if not isinstance(verdict, Grant):
        return _refused(log, where, verdict.why)
    try:
        policy = aws_iam.packed(aws_iam.session_policy(verdict.scope, settings.partition, settings.deployment))
    except ValueError as exc:  # no retry would make it fit: a verdict, not a failure
        return _refused(log, where, f"job {verdict.job_id}'s credentials cannot be granted: {exc}")
    credentials = cloud.credentials(settings.job_role_arn, session_name(verdict.job_id, verdict.attempt), policy,
                                    verdict.seconds)
    log.info("vend: granted", extra={**where, "expiration": credentials["Expiration"],
                                     "read_write": list(verdict.scope.read_write)})
    return Answer(200, credentials)


def _vm_instance(arn: str, vm_role_arn: str) -> str | None:
    """The instance id (the session's name) when arn is a session of the VM role, else None."""
    caller, role = _ASSUMED.match(arn), _ROLE.match(vm_role_arn)
    if caller is None or role is None or caller.groups()[:3] != role.groups():
        return None
    return caller.group(4)


def _refused(log: Log, where: dict[str, Any], why: str) -> Answer:
    log.warning("vend: refused", extra={**where, "why": why})
    return Answer(403, {"refused": why})
