"""Who uses what of the quotas (`jobplane queue`'s first table, Client.usage, the dashboard's Queue page), as the
admission counts it, Slurm's `sshare` and a Kueue ClusterQueue's status in one: each owner's nodes in use against its
quota, its jobs waiting in line, its weight and fair share of the deployment's cap, its spend this month against its
budget; the deployment's cap and each instance family's cap, with the nodes they hold.

Read from the admission records (jobplane.model.admission), never from a listing of VMs: one listing of the owners'
records and a GET each, a GET of each owner with a budget or a weight that has no record listed, of the deployment's
record when the policy sets a cap and of each capped family's record, and the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.decide import budget
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.store import admission
from jobplane.store.registry import Registry

if TYPE_CHECKING:
    from jobplane.model.admission import AdmissionRecord


@dataclass(frozen=True)
class OwnerUsage:
    """One owner: nodes its jobs hold of its quota, its jobs waiting in its line, its weight and fair share of the
    deployment's cap (None: no cap), its spend this month against its budget (None: it has none)."""

    owner: str
    in_use: int
    quota: int  # max_active_instances_per_owner
    waiting: int
    weight: float  # owner_weights (1 unless named)
    share: float | None  # nodes of the cap its weight gives it among the owners holding or waiting for nodes
    budget: budget.Budget | None

    @property
    def per_weight(self) -> float:
        """Nodes in use per weight: when the deployment's cap binds, the owner with the least goes next."""
        return self.in_use / self.weight

    def as_dict(self) -> dict[str, object]:
        return {"owner": self.owner, "in_use": self.in_use, "quota": self.quota, "waiting": self.waiting,
                "weight": self.weight, "fair_share": None if self.share is None else round(self.share, 2),
                "nodes_per_weight": round(self.per_weight, 3),
                "budget": None if self.budget is None else self.budget.as_json()}


@dataclass(frozen=True)
class Cap:
    """A deployment-wide cap: the deployment's (max_active_instances) or an instance family's (max_active_by_family)."""

    name: str  # "deployment", or the family: "p4d"
    field: str  # the policy's field that sets it
    in_use: int
    limit: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "field": self.field, "in_use": self.in_use, "limit": self.limit}

    def __str__(self) -> str:
        return f"{self.in_use} of {self.limit} nodes in use ({self.field})"


@dataclass(frozen=True)
class Usage:
    owners: list[OwnerUsage]  # by name
    deployment: Cap | None  # None: the policy sets no max_active_instances
    families: list[Cap]  # by family

    def as_dict(self) -> dict[str, object]:
        return {"owners": [o.as_dict() for o in self.owners],
                "deployment": None if self.deployment is None else self.deployment.as_dict(),
                "families": [f.as_dict() for f in self.families]}


def usage(reg: Registry, owner: str | None = None, now: datetime | None = None) -> Usage:
    """Every owner holding or waiting for nodes, or named by the policy's budgets or weights (or only `owner`), and
    the deployment's caps."""
    now = now or utcnow()
    policy = reg.policy()
    records: dict[str, AdmissionRecord] = {}
    for key, _, _ in list(reg.listing(keys.ADMISSION_OWNERS)):
        record = admission.read(reg, key)[0]
        name = record.whose() or key.removeprefix(keys.ADMISSION_OWNERS).removesuffix(".json")
        if owner in (None, name) and (record.reservations or record.waiting or record.spend(now)):
            records[name] = record
    named = set(policy.budgets.monthly_usd) | set(policy.owner_weights) if owner is None else {owner}
    for name in sorted(named - set(records)):
        records[name] = admission.read(reg, keys.admission_owner(name))[0]
    active = sum(policy.weight(n) for n, r in records.items() if r.reservations or r.waiting)
    cap = policy.max_active_instances
    owners = []
    for name, record in sorted(records.items()):
        weight = policy.weight(name)
        others = active if record.reservations or record.waiting else active + weight
        owners.append(OwnerUsage(name, record.used(), policy.max_active_instances_per_owner, len(record.waiting),
                                 weight, None if cap is None else cap * weight / others,
                                 budget.standing(name, record, policy, now)))
    deployment = None if cap is None else Cap(
        "deployment", "max_active_instances", admission.read(reg, keys.ADMISSION_DEPLOYMENT)[0].used(), cap)
    families = [Cap(family, f"max_active_by_family.{family}",
                    admission.read(reg, keys.admission_family(family))[0].used(), limit)
                for family, limit in sorted(policy.max_active_by_family.items())]
    return Usage(owners, deployment, families)
