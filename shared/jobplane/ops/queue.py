"""Where waiting jobs stand (`jobplane queue`, Client.queue): each owner's line in admission order, with why each
job waits, and the jobs waiting for their `after:`. Read from listings and the admission records: one listing of
active/ and of after/, one of the owners' records and a GET each, a GET of the deployment's record (when the policy
caps it) and of each capped instance family's, the policy, and the record of each job waiting for a dependency (few:
a job in a line costs no GET). Why a job in a line waits is jobplane.decide.waiting.why, the wording the launcher
records as its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobplane.decide import waiting
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.store import admission
from jobplane.store.registry import JobNotFound, Registry


@dataclass(frozen=True)
class Standing:
    """One waiting job: its place in its owner's line (None: it waits for a dependency, in no line yet) and why; or
    an array's members not dropped yet (`size`, `not_dropped`: jobplane.sweeps.ops.array_waits)."""

    job_id: str
    owner: str
    position: int | None
    priority: int
    nodes: int
    since: datetime | None  # its submission
    why: str
    priority_class: str | None = None  # the class the priority is of, by name (Policy.priority_class)
    size: int | None = None  # an array's members in all
    not_dropped: int | None = None  # an array's members it has not dropped yet

    @property
    def priority_name(self) -> str:
        """The priority as people name it: its class ('urgent'), else its value ('0')."""
        return self.priority_class or str(self.priority)

    def as_dict(self) -> dict[str, object]:
        array = {"array": {"size": self.size, "not_dropped": self.not_dropped}} if self.size is not None else {}
        return {"id": self.job_id, "owner": self.owner, "position": self.position, "priority": self.priority,
                "priority_class": self.priority_class, "nodes": self.nodes,
                "submitted": self.since.isoformat() if self.since else None, "why": self.why, **array}


def standing(reg: Registry, owner: str | None = None, now: datetime | None = None) -> list[Standing]:
    """Every waiting job (or one owner's), each owner's line in the order it goes, then the dependency waits."""
    now = now or utcnow()
    states = {job_id: markers[-1].state for job_id, markers in reg.active().items() if markers}
    policy = reg.policy()
    families = {f: admission.read(reg, keys.admission_family(f))[0] for f in policy.max_active_by_family}
    deployment = admission.read(reg, keys.ADMISSION_DEPLOYMENT)[0] if policy.max_active_instances is not None else None
    out: list[Standing] = []
    for key, _, _ in list(reg.listing(keys.ADMISSION_OWNERS)):
        record = admission.read(reg, key)[0]
        line = [w for w in record.queue() if states.get(w.job_id) == State.WAITING_CAPACITY]
        if not line or (owner is not None and line[0].owner != owner):
            continue
        for n, waiter in enumerate(line):  # the launcher's reason's one wording (jobplane.decide.waiting)
            why = waiting.why(waiter, record, policy, now, deployment=deployment, families=families)
            out.append(Standing(waiter.job_id, waiter.owner, n + 1, waiter.priority, waiter.nodes, waiter.submitted,
                                why, policy.priority_class(waiter.priority)))
    waits: dict[str, list[str]] = {}
    for key, _, _ in reg.listing(keys.AFTER):
        dependency, _, job_id = key.removeprefix(keys.AFTER).partition("/")
        if states.get(job_id) == State.WAITING_CAPACITY:
            waits.setdefault(job_id, []).append(dependency)
    for job_id, dependencies in sorted(waits.items()):
        try:
            job = reg.job(job_id)
        except JobNotFound:
            continue
        if owner is not None and job.owner != owner:
            continue
        on = ", ".join(f"{d} ({states.get(d) or ('RUNNING' if reg.has(keys.active_sweep(d)) else 'ended')})"
                       for d in dependencies)  # a job's marker, else a live array's
        out.append(Standing(job_id, job.owner, None, policy.priority(job.spec), job.spec.num_nodes, job.created_at,
                            f"dependency: waiting for {on}", policy.priority_class(policy.priority(job.spec))))
    return out
