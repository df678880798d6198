"""The GCP credential vending function's logic (functions/gcp/main.py `vend` is its HTTP shell): a job's VM
proves which VM it is with its identity token, `decide.vend` says whether it serves the job it names, and a
grant is an access token downscoped to that job's keys (clouds/gcs_downscope).

The request: POST JSON {"identity_token": <the VM's>, "job_id": ..., "attempt": n, "instance_id": "zone/name"
(optional: must be the token's VM)}; the token may come as `Authorization: Bearer` instead (Cloud Run's invoker
check reads that header too). The answers: 200 {"access_token", "expires_in"}, 403 {"refused": why} (also when
the token proves nothing), 400 {"error": naming the field}. Every decision is logged with its job.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from jobplane.clouds.base import Instance, Scope
from jobplane.clouds.gce_identity import GOOGLE_CERTS_URL, NotProven, ProvenVm
from jobplane.clouds.gcp import deployment_label, ownership_tags
from jobplane.clouds.gcs_downscope import GOOGLE_STS_URL, Downscoped
from jobplane.decide import vend as deciding
from jobplane.model import keys
from jobplane.model.jobfacts import JobFacts
from jobplane.model.secrets import SecretMissing
from jobplane.store.registry import JobNotFound, UnreadableRecord, read_job_facts
from jobplane.store.rooted import RootedStore

log = logging.getLogger("jobplane.vend")


@dataclass(frozen=True)
class VendConfig:
    """audience: the function's own URL (the agents ask for tokens for it); service_account: the job VMs'.
    certs_url and sts_url are Google's unless the local cloud points them at its fakes, which must then be on
    loopback: a deployment never trusts keys or mints tokens anywhere else."""

    audience: str
    service_account: str
    project: str
    certs_url: str = GOOGLE_CERTS_URL
    sts_url: str = GOOGLE_STS_URL

    def __post_init__(self) -> None:
        for name, url, google in (("certs_url", self.certs_url, GOOGLE_CERTS_URL),
                                  ("sts_url", self.sts_url, GOOGLE_STS_URL)):
            if url != google and not _on_loopback(url):
                raise ValueError(f"{name} {url} is neither Google's ({google}) nor on 127.0.0.0/8")
        if not (self.audience and self.service_account and self.project):
            raise ValueError("vending needs its audience (JOBPLANE_VEND_URL), the VMs' service account and a project")


def _on_loopback(url: str) -> bool:
    try:
        return ipaddress.ip_address(urlsplit(url).hostname or "") in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


class Vms(Protocol):
    def find(self, instance_id: str) -> tuple[Instance, str] | None: ...


@dataclass(frozen=True)
class Cloud:
    """What vending asks Google: who signed the token, which VM that is, a token for a scope."""

    verify: Callable[[str], ProvenVm]  # raises NotProven
    vms: Vms
    downscope: Callable[[Scope], Downscoped]
    # (owner, name) -> a secret's value, with the function's own identity: a downscoped token reaches Cloud Storage
    # only, so the function hands a job the secrets its grant names (decide.vend's scope), and no other
    secrets: Callable[[str, str], bytes] | None = None


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)


def _bad(name: str, why: str) -> Answer:
    log.warning("vend bad request: %s: %s", name, why, extra={"result": "bad-request"})
    return Answer(400, {"error": f"{name}: {why}"})


def _refused(why: str, job_id: str | None = None) -> Answer:
    log.warning("vend refused: %s", why, extra={"job_id": job_id, "result": "refused"})
    return Answer(403, {"refused": why})


def read_request(body: Any, authorization: str | None) -> tuple[str, str, int, str | None] | Answer:
    """(token, job id, attempt, claimed instance id), or a 400 naming the field."""
    if not isinstance(body, Mapping):
        return _bad("body", "expected a JSON object")
    token = body.get("identity_token")
    if token is None and authorization and authorization.lower().startswith("bearer "):
        token = authorization[7:].strip()
    if not isinstance(token, str) or not token:
        return _bad("identity_token", "the VM's identity token is required (or Authorization: Bearer)")
    job_id, attempt, claimed = body.get("job_id"), body.get("attempt"), body.get("instance_id")
    if not isinstance(job_id, str) or not re.fullmatch(keys.JOB_ID_PATTERN, job_id):
        return _bad("job_id", f"a job id is required ({keys.JOB_ID_PATTERN})")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        return _bad("attempt", "a positive integer is required")
    if claimed is not None and not isinstance(claimed, str):
        return _bad("instance_id", "zone/name of the VM, if given")
    return token, job_id, attempt, claimed


def _record(registry: RootedStore, job_id: str) -> JobFacts | None:
    try:
        return read_job_facts(registry, job_id)
    except JobNotFound:
        return None


def vend(body: Any, authorization: str | None, *, config: VendConfig, registry: RootedStore, deployment: str,
         cloud: Cloud) -> Answer:
    """Answer one agent's request for its job's credentials. deployment: Settings.deployment (bucket[/root]),
    compared with the VM's deployment label."""
    parsed = read_request(body, authorization)
    if isinstance(parsed, Answer):
        return parsed
    token, job_id, attempt, claimed = parsed
    try:
        vm = cloud.verify(token)
    except NotProven as err:
        return _refused(f"the identity token proves no VM of this deployment: {err}", job_id)
    if vm.project != config.project:
        return _refused(f"{vm.instance_id} is in project {vm.project}, not {config.project}", job_id)
    found = cloud.vms.find(vm.instance_id)
    tags = None
    if found is not None and found[1] == vm.numeric_id:  # a VM re-created under the name is another VM
        tags = ownership_tags(dict(found[0].tags))
    caller = deciding.Caller(vm.instance_id, job_id, attempt, claimed_instance_id=claimed, tags=tags)
    try:
        record = _record(registry, job_id)
    except UnreadableRecord as err:
        return _refused(f"the record of job {job_id} does not parse: {err}", job_id)
    decision = deciding.decide(record, caller, bucket=registry.bucket or "", root=registry.root,
                               deployment=deployment_label(deployment))
    if isinstance(decision, deciding.Refusal):
        return _refused(decision.why, job_id)
    granted = cloud.downscope(decision.scope)
    log.info("vend granted %s attempt %d to %s for %d s", decision.job_id, decision.attempt, decision.instance_id,
             granted.expires_in, extra={"job_id": decision.job_id, "result": "granted",
                                        "secrets": list(decision.scope.secrets)})  # names: never a value
    answer: dict[str, Any] = {"access_token": granted.access_token, "expires_in": granted.expires_in}
    if decision.scope.secrets:
        answer["secrets"] = _secrets(cloud, decision.scope)
    return Answer(200, answer)


def _secrets(cloud: Cloud, scope: Scope) -> dict[str, str]:
    """The values (base64) of the secrets the grant names, of the job's owner; one it lacks is left out (the agent
    fails the job naming the field)."""
    if cloud.secrets is None:
        return {}
    found: dict[str, str] = {}
    for name in scope.secrets:
        try:
            found[name] = base64.b64encode(cloud.secrets(scope.secret_owner, name)).decode()
        except SecretMissing:
            continue
    return found
