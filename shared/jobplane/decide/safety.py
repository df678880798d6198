"""Safety rails every terminating decision passes through: ownership, protection, blast radius."""

from __future__ import annotations

import math
from collections.abc import Iterable

from jobplane.clouds.base import Instance
from jobplane.decide.model import Action, alive
from jobplane.model.policy import Policy


def terminable(instances: Iterable[Instance]) -> tuple[str, ...]:
    """Ids we may terminate: managed, not protected, not already gone."""
    return tuple(i.id for i in instances if i.managed and not i.protected and i.state != "terminated")


def budget(policy: Policy, managed: int) -> int:
    """Most instances one run may terminate: N, and P% of the managed fleet rounded up (so a fleet of
    one can still lose its one orphan at any P > 0)."""
    safety = policy.safety
    return min(safety.max_terminations_per_run, math.ceil(managed * safety.max_terminations_percent / 100))


def limit_blast_radius(actions: list[Action], instances: Iterable[Instance], policy: Policy,
                       *, force: bool = False) -> list[Action]:
    """Refuse, whole, every action whose terminations would push this run past the budget.

    Actions keep their order (the decide functions list the least risky first: finished jobs, then lost,
    stalled, timed out, orphans last), so a mass termination caused by, say, an empty registry listing
    stops after the budget while ordinary clean-up proceeds. The first terminating action of a run is
    bounded by N only, so one multi-node job can always be torn down, even in a small fleet.
    """
    if force:
        return actions
    managed = sum(1 for i in instances if i.managed and alive(i))
    left = budget(policy, managed)
    out: list[Action] = []
    first = True
    for action in actions:
        n = len(action.terminate)
        if n and n > left and not (first and n <= policy.safety.max_terminations_per_run):
            out.append(action.refuse(f"blast radius: {n} more terminations would exceed this run's limit of "
                                     f"{budget(policy, managed)} (max {policy.safety.max_terminations_per_run}, "
                                     f"{policy.safety.max_terminations_percent}% of {managed} managed)"))
        else:
            left, first = max(0, left - n), first and not n
            out.append(action)
    return out
