"""Each owner's spend this month against its budget (`jobplane cost`, Client.budgets): what the admission decides
on, from the owners' admission records (jobplane.decide.budget). The policy and a GET per owner with a budget."""

from __future__ import annotations

from datetime import datetime

from jobplane.decide import budget
from jobplane.model import keys
from jobplane.store import admission
from jobplane.store.registry import Registry


def standings(reg: Registry, now: datetime) -> list[budget.Budget]:
    """Every owner the policy gives a budget, by name."""
    policy = reg.policy()
    out = []
    for owner in sorted(policy.budgets.monthly_usd):
        found = budget.standing(owner, admission.read(reg, keys.admission_owner(owner))[0], policy, now)
        if found is not None:
            out.append(found)
    return out
