"""What a spec must pass to be queued, checked against the registry as it is now: the live policy
(jobplane.model.policy.check_against_policy: instance types, nodes, ceilings, the priority class and who may use it,
an array or a sweep that can never fit the quotas), what its `after:` names (jobplane.decide.dependencies.problems:
jobs and arrays that exist), and its owner's budget when the policy refuses a new job past it.

The launcher runs the first two on every drop and decides (a drop that fails them is recorded INVALID); `submit`
(Client.submit) runs all three before it uploads code or writes the drop, so a spec the launcher would refuse is
refused at once, naming the field, instead of a job seen INVALID (or FAILED over its budget) seconds later. The policy
may change between the two: the launcher's answer is the one that holds.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.decide import budget, dependencies
from jobplane.model import keys
from jobplane.model.errors import FieldError
from jobplane.model.policy import Policy, check_against_policy
from jobplane.store import admission
from jobplane.store.registry import Registry

if TYPE_CHECKING:
    from jobplane.model.spec import JobSpec


def dependency_problems(reg: Registry, spec: JobSpec, job_id: str, *, queued: bool = False) -> list[FieldError]:
    """What the spec's `after:` names wrongly: each id must be a job's (its record) or an array's (or a sweep's:
    sweeps/<id>/sweep.json), a HEAD or two each; with `queued`, a drop not yet recorded counts too (one listing of
    queue/, only when an id is neither: submit allows it, and the launcher decides when it takes this drop)."""
    names = {entry.target for entry in dependencies.entries(spec.after)}
    known = {name for name in names if reg.exists(name) or reg.has(keys.sweep_record(name))}
    if queued and names - known:
        known |= {drop.job_id for key, _, _ in reg.listing(keys.QUEUE) if (drop := keys.parse_drop(key))} & names
    return dependencies.problems(spec.after, job_id, {name: name in known for name in names})


def budget_problems(reg: Registry, spec: JobSpec, policy: Policy, now: datetime) -> list[FieldError]:
    """An owner at its budget whose new jobs the policy refuses (`budgets.on_exceeded: refuse`): the owner's admission
    record, one GET, only for an owner with a budget."""
    if policy.budgets.on_exceeded_for(spec.owner) != "refuse" or policy.budgets.limit(spec.owner) is None:
        return []
    over = budget.exceeded(spec.owner, admission.read(reg, keys.admission_owner(spec.owner))[0], policy, now)
    if over is None:
        return []
    return [FieldError("owner", f"{over.reason}: a new job of {spec.owner} is refused until the month turns "
                                "(budgets.on_exceeded: refuse)")]


def problems(reg: Registry, spec: JobSpec, job_id: str, now: datetime) -> list[FieldError]:
    """Everything submit checks before it writes the drop, each naming the spec's field: the live policy, `after:`
    (a dependency still in queue/ counts) and the owner's budget."""
    policy = reg.policy()
    return (check_against_policy(spec, policy) + dependency_problems(reg, spec, job_id, queued=True)
            + budget_problems(reg, spec, policy, now))
