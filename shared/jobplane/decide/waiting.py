"""Why a job waits, and what the quotas hold: pure, over the admission records (jobplane.model.admission).

`why` is the one wording of a wait for quota: the launcher records it as the job's reason when an admission refuses
the attempt (jobplane.control.admission), and every view of the queue (`jobplane queue`, describe's queue line,
Client.queue, the dashboard's Queue page: jobplane.ops.queue) shows it from the records as they stand, so the two
never disagree. It checks what the admission checks, in the admission's order: the policy in force (a job that can
never fit), the owner's budget, the owner's line, the owner's quota, each capped instance family, the deployment's cap
and its order. `usage` gives the figures a queue's header shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.decide import admission, budget
from jobplane.model.policy import Policy

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.admission import AdmissionRecord, Reservation

FREE = "its nodes are free: the next in-order admission (a check, the launcher's backstop) launches it"


def why(job: Reservation, owner: AdmissionRecord, policy: Policy, now: datetime, *,
        deployment: AdmissionRecord | None = None, families: Mapping[str, AdmissionRecord] | None = None) -> str:
    """Why `job` (its attempt, as its owner's line or its admission holds it) waits, from its owner's record, the
    deployment's (None: not read; the policy sets no cap) and the capped families' records (those not given are not
    looked at). Each record's count leaves the job's own reservation out: a launcher that just refused it and a view
    that reads the records later say the same."""
    never = admission.never_fits(job, policy)
    if never is not None:
        return never
    spent = budget.holds(job, owner, policy, now)
    if spent is not None:
        return spent.reason
    quota = admission.owner_quota(job.owner, policy)
    used = owner.used(besides=job.job_id)
    ahead = admission.ahead_of(owner, job, budget.passing(job, owner, policy, now))
    if ahead:
        return admission.behind(quota, ahead, used)
    if used + job.nodes > quota.limit:
        return admission.over(quota, used, job.nodes)
    found = families or {}
    for family in admission.capped_families(job, policy):
        if family in found and (held := found[family].used(besides=job.job_id)) + job.nodes > \
                policy.max_active_by_family[family]:
            return admission.over(admission.family_quota(family, policy), held, job.nodes)
    cap = admission.cap_quota(policy)
    if cap is not None and deployment is not None:
        full = admission.turn(deployment, job, cap, policy.weight,
                              admission.family_room(policy, found, besides=job.job_id))[1]
        if full is not None:
            return full.reason
    return FREE


@dataclass(frozen=True)
class Held:
    """Nodes one quota's holders hold, against its limit (None: no limit)."""

    name: str  # the owner, "deployment", or the family
    field: str  # the policy's field that sets the limit
    used: int
    limit: int | None
    waiting: int  # jobs waiting in its line (an owner's) or its order (the deployment's)
    weight: float | None = None  # an owner's fair-share weight under the deployment's cap

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "field": self.field, "used": self.used, "limit": self.limit,
                "waiting": self.waiting, "weight": self.weight}


def usage(owners: list[AdmissionRecord], policy: Policy, *, deployment: AdmissionRecord | None = None,
          families: Mapping[str, AdmissionRecord] | None = None) -> list[Held]:
    """What each quota holds: every owner with a record (its quota, and its weight when the policy sets a cap), the
    deployment's cap, then each capped family, from the records as read."""
    out = []
    for record in owners:
        name = record.whose()
        if name is not None:
            out.append(Held(name, "max_active_instances_per_owner", record.used(),
                            policy.max_active_instances_per_owner, len(record.waiting),
                            policy.weight(name) if policy.max_active_instances is not None else None))
    if policy.max_active_instances is not None:
        held = deployment.used() if deployment is not None else 0
        out.append(Held("deployment", "max_active_instances", held, policy.max_active_instances,
                        len(deployment.waiting) if deployment is not None else 0))
    for family, limit in sorted(policy.max_active_by_family.items()):
        counted = (families or {}).get(family)
        out.append(Held(family, f"max_active_by_family.{family}", counted.used() if counted is not None else 0, limit,
                        0))
    return out
