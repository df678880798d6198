"""The uptime cap's decisions: cap = min(job max_runtime, policy ceiling), per attempt since its launch.

At cap - grace (grace = policy stop_grace, at most cap/10) the job gets a stop request, so the agent
checkpoints and exits; at the cap its instances are terminated and the job is TIMED_OUT. A managed
instance with no live job (or of a past attempt) gets the policy ceiling.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from jobplane.clouds.base import Instance
from jobplane.decide.effects import RequestStop, Terminate, Transition
from jobplane.decide.model import Action, Index, Rule, Snapshot, age, alive, grace_for
from jobplane.decide.safety import limit_blast_radius, terminable
from jobplane.model.bounds import format_duration
from jobplane.model.policy import Policy
from jobplane.model.states import LIVE, State


def cap_for(index: Index, job_id: str, attempt: int, policy: Policy) -> int:
    """The limits/ key's cap (no GET), else the fetched record's, else the ceiling (never cut a job short)."""
    ceiling = policy.max_runtime_ceiling
    limits = index.limits.get((job_id, attempt))
    if limits is not None:
        return min(limits.cap, ceiling)
    record = index.snap.records.get(job_id)
    return policy.max_runtime(record.spec) if record is not None else ceiling


def needs_record(snap: Snapshot) -> set[str]:
    """Live jobs with running instances but no limits/ key yet (LAUNCHING, or a crash before the key)."""
    index = Index(snap)
    return {i.job_id for i in snap.instances if i.job_id is not None and i.job_id in snap.active and alive(i)
            and (i.job_id, i.attempt) not in index.limits}


def decide(snap: Snapshot, now: datetime, policy: Policy, *, force: bool = False) -> list[Action]:
    index = Index(snap)
    groups: defaultdict[tuple[str | None, int | None], list[Instance]] = defaultdict(list)
    for inst in snap.instances:
        if alive(inst) and terminable([inst]):
            groups[inst.job_id, inst.attempt].append(inst)
    held = {(h.job_id, h.attempt) for h in snap.held if now < h.until}  # the check ends a debug hold
    actions: list[Action] = []
    for (job_id, attempt), instances in sorted(groups.items(), key=lambda g: (g[0][0] or "", g[0][1] or 0)):
        uptime = max(age(now, i.launched_at) for i in instances)
        if (job_id, attempt) in held:
            continue
        if job_id is None or attempt is None or attempt != index.current_attempt(job_id):
            ceiling = policy.max_runtime_ceiling
            actions += [Action(Rule.CAP_NO_JOB, job_id, Rule.CAP_NO_JOB.reason(instance=i.id,
                                                                               ceiling=format_duration(ceiling)),
                               (Terminate((i.id,)),))
                        for i in instances if age(now, i.launched_at) >= ceiling]
            continue
        cap = cap_for(index, job_id, attempt, policy)
        if uptime >= cap:
            actions.append(Action(Rule.TIMED_OUT, job_id, Rule.TIMED_OUT.reason(cap=format_duration(cap)),
                                  (Transition(State.TIMED_OUT), Terminate(terminable(instances))), expect=LIVE,
                                  expect_attempt=attempt))
        elif uptime >= cap - grace_for(cap, policy):
            actions.append(Action(Rule.STOP, job_id, Rule.STOP.reason(cap=format_duration(cap),
                                                                      left=format_duration(max(1, int(cap - uptime)))),
                                  (RequestStop(),)))
    return limit_blast_radius(actions, snap.instances, policy, force=force)
