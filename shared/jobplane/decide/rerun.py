"""Rerun's decisions: what to do with each preempted-jobs/<id> marker.

Restarts left, attempts left (the policy's max_attempts_per_job) and max_wait not exceeded -> relaunch (the
launcher claims the job by CAS, so overlapping runs launch one attempt); otherwise FAILED with the reason. The
marker is cleared only after the new attempt is recorded, or once it is stale (the job moved past that attempt, or
ended). A marker for a RUNNING or LAUNCHING job must name an instance of its current attempt; any other is cleared
with an event. The ranks of the preempted attempt still alive are terminated with the relaunch (or the failure),
before the new attempt starts: two lives of one rank must never write checkpoints side by side for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from jobplane.clouds.base import Instance
from jobplane.decide.effects import ClearPreempted, Relaunch, Terminate, Transition
from jobplane.decide.model import (
    Action,
    Ignored,
    PreemptedMark,
    Rule,
    Snapshot,
    age,
    attempts_spent,
    claim,
    ignored_event,
    trusted_mark,
)
from jobplane.decide.safety import terminable
from jobplane.model import keys
from jobplane.model.bounds import format_duration
from jobplane.model.policy import Policy
from jobplane.model.states import State

if TYPE_CHECKING:  # the records' models (pydantic): loaded where a run reads or writes a record, never by an idle run
    from jobplane.model.jobrecord import JobRecord


def decide(snap: Snapshot, now: datetime, policy: Policy) -> list[Action]:
    return [_one(mark, snap.records.get(job_id), snap.instances, now, policy)
            for job_id, mark in sorted(snap.preempted.items())
            if job_id not in snap.unreadable_records]  # its marker waits: the record may read again


def _one(mark: PreemptedMark, record: JobRecord | None, instances: Sequence[Instance], now: datetime,
         policy: Policy) -> Action:
    job_id = mark.job_id
    if record is None:
        return _clear(job_id, "no such job")
    if record.terminal:
        return _clear(job_id, f"job already {record.state}")
    if mark.attempt is not None and mark.attempt < record.attempt:
        return _clear(job_id, f"attempt {mark.attempt} already rerun as {record.attempt}")
    if record.state not in (State.RUNNING, State.LAUNCHING, State.PREEMPTED):
        return _clear(job_id, f"attempt {record.attempt} is {record.state}")
    if record.state != State.PREEMPTED and not trusted_mark(mark, record, instances):
        # every VM may write any job's marker: only one of this attempt's may preempt it
        why = mark.problem or (f"names {mark.instance_id or 'no instance'} of attempt {mark.attempt}, not an instance "
                               f"of attempt {record.attempt}")
        return Action(Rule.IGNORED, job_id, Rule.IGNORED.reason(fact="preempted marker", why=why),
                      (ClearPreempted(), ignored_event(record.attempt, Ignored(keys.preempted_marker(job_id), why))))
    # A PREEMPTED job's marker only queues it here (a function made the transition): a body that does not
    # parse is noted on the job, and the rerun goes on.
    noted = ((ignored_event(record.attempt, Ignored(keys.preempted_marker(job_id), mark.problem)),)
             if mark.problem else ())
    # A RUNNING job the agent reported goes through PREEMPTED (recorded, with its event) before the rerun.
    via = (Transition(State.PREEMPTED),) if record.state != State.PREEMPTED else ()
    spec = record.spec
    survivors = Terminate(terminable(i for i in instances if i.job_id == job_id and i.attempt == record.attempt
                                     and i.state in ("pending", "running")))
    if record.restarts >= spec.max_restarts:
        return claim(record, Rule.RERUN_EXHAUSTED,
                     Rule.RERUN_EXHAUSTED.reason(why=f"no restarts left (max_restarts {spec.max_restarts})"),
                     Transition(State.FAILED), ClearPreempted(), *noted, survivors)
    if record.attempt >= policy.max_attempts(spec):
        return claim(record, Rule.RERUN_EXHAUSTED, Rule.RERUN_EXHAUSTED.reason(why=attempts_spent(record, policy)),
                     Transition(State.FAILED), ClearPreempted(), *noted, survivors)
    max_wait = policy.max_wait(spec)
    if age(now, record.created_at) > max_wait:
        return claim(record, Rule.RERUN_EXHAUSTED,
                     Rule.RERUN_EXHAUSTED.reason(why=f"max_wait {format_duration(max_wait)} exceeded"),
                     Transition(State.FAILED), ClearPreempted(), *noted, survivors)
    return claim(record, Rule.RERUN, Rule.RERUN.reason(next=record.attempt + 1), *via, Relaunch(), ClearPreempted(),
                 *noted, survivors)


def _clear(job_id: str, why: str) -> Action:
    """A marker nobody needs any more: why it is stale."""
    return Action(Rule.CLEAR, job_id, Rule.CLEAR.reason(why=why), (ClearPreempted(),))
