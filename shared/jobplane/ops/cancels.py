"""Cancelling a job: `jobplane cancel`, the SDK's Job.cancel and the dashboard's button.

Whoever may write the job's record (the platform team; the functions carrying out a request) cancels it at once
(`cancel`). A team member may not: IAM lets it write only its team's folders, never a record nor a stop request,
which would let it stop another team's job. It asks the functions instead (`request`): a request in its team's
cancels/<owner>/, which they carry out only for a job of that owner (jobplane.control.cancels), and it waits for the
job to end. IAM refuses a request in another team's folder: that is the refusal a person sees.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobplane.clouds.base import Compute
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import LIVE, NOT_STARTED, State
from jobplane.ops.jobs import ComputeFactory, JobError, find
from jobplane.store.registry import JobExists, Registry, TransitionRefused

REQUEST_WAIT_S = 60.0  # how long a team member's cancel waits for the functions to carry out its request


@dataclass(frozen=True)
class Cancelled:
    """What a cancel did: the record it left (CANCELLED), whether the job had started (its agents stop
    gracefully) or not (before_launch: it never runs), and the VMs it terminated at once (force: one its agent
    powered off meanwhile is among them: it is gone either way)."""

    record: JobRecord
    started: bool  # it was RUNNING (or past it): its agents stop gracefully
    terminated: tuple[str, ...] = ()
    requested: bool = False  # a team member's cancel, carried out by the functions (`request`): record as last read

    @property
    def before_launch(self) -> bool:
        return self.record.attempt == 0


def cancel(reg: Registry, job_id: str, *, force: bool = False, compute: ComputeFactory | None = None,
           by: str | None = None) -> Cancelled:
    """Mark the job CANCELLED; a job cancelled before it ran never runs, a running one stops gracefully. `by`: the
    team whose member asked (a cancel request the functions carry out, jobplane.control.cancels), else the user.

    Race-safe by the registry, not by timing. A queued job's record is created create-only from its drop
    (the spec the launcher would parse); then the job moves to CANCELLED by CAS. The launcher claims by a
    CAS QUEUED -> LAUNCHING on the same record, so one of the two is first:
    - the cancel: the claim is refused, nothing is launched;
    - the launcher: it re-reads the record before each RunInstances, and terminates the VMs it just got if
      recording them is refused; if it recorded them first, the cancel's CAS (made while the job was still
      LAUNCHING) returns them, and the cancel terminates them (needs compute).
    Either way no VM of a job cancelled before it ran survives. force terminates a running job's VMs too:
    those listed before the stop request (its agents cannot have powered them off yet, so a fast agent does not
    change what is reported) and those listed after the CAS (launched meanwhile).
    """
    view = find(reg, job_id)
    if view.terminal:
        raise JobError(f"job {job_id} is already {view.state}")
    if view.record is None:
        if view.spec is None:
            raise JobError(f"job {job_id} is still in queue/ and its spec is invalid, so the launcher will "
                           f"reject it: {view.reason}")
        with contextlib.suppress(JobExists):  # the launcher recorded it meanwhile: cancel that record
            reg.create_job(job_id, view.spec)
    adapter = compute() if force and compute is not None else None
    running = _job_vms(adapter, job_id) if adapter is not None else set()
    who = f"a member of {by}" if by else "the user"
    reg.request_stop(job_id, by=records.StopBy.CLI, reason=f"cancel by {by}" if by else "cancel", now=utcnow())
    try:  # the state at the CAS decides, not the one find() saw
        record = reg.transition(job_id, State.CANCELLED, expect=NOT_STARTED,
                                reason=f"cancelled by {who} before it started")
        started = False
    except TransitionRefused:  # RUNNING or PREEMPTED (or it ended meanwhile: refused again, said so)
        record = reg.transition(job_id, State.CANCELLED, expect=LIVE, reason=f"cancelled by {who}")
        started = True
    if view.drop:
        reg.delete(view.drop)  # the launcher may be reading it: its claim is refused, and it deletes it too
    doomed = set() if started else set(record.instances)  # launched by a launcher a step ahead
    if adapter is not None:
        doomed |= running | _job_vms(adapter, job_id)
    if doomed and compute is not None:
        (adapter or compute()).terminate(sorted(doomed))
    return Cancelled(record, started, terminated=tuple(sorted(doomed)))


def _job_vms(adapter: Compute, job_id: str) -> set[str]:
    return {i.id for i in adapter.list_managed() if i.job_id == job_id and not i.protected}


def ask(reg: Registry, owner: str, target: str, *, force: bool = False) -> None:
    """Write the request that the functions cancel `target` (a job, a sweep or an array) of `owner`'s: in its
    cancels/<owner>/, which IAM lets only that team's members (and the platform team) write."""
    body = {"version": 1, "force": force, "time": utcnow().isoformat()}
    reg.put(keys.cancel_request(owner, target), json.dumps(body).encode(), "application/json")


def request(reg: Registry, job_id: str, *, force: bool = False, wait: float = REQUEST_WAIT_S,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Cancelled:
    """Ask the functions to cancel the job (a request in its owner's cancels/<owner>/: AccessDenied when that is not
    the caller's team), then wait up to `wait` seconds for it to end. The record as last read: ended (CANCELLED,
    or how it ended meanwhile), or still live if the functions have not come to it yet (they will: the request
    stays until they do)."""
    view = find(reg, job_id)
    if view.terminal:
        raise JobError(f"job {job_id} is already {view.state}")
    ask(reg, view.owner, job_id, force=force)
    deadline = clock() + wait
    while True:
        view = find(reg, job_id)
        if view.record is not None and (view.terminal or clock() >= deadline):
            return Cancelled(view.record, started=view.record.attempt > 0, requested=True)
        if clock() >= deadline:  # not recorded yet: the launcher has not taken its drop
            raise JobError(f"job {job_id}: cancel requested; the functions have not carried it out in {wait:.0f} s "
                           "(they will: the request stays in cancels/ until they do)")
        sleep(1.0)
