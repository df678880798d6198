"""What an action does, as small typed effects: a decision lists the ones it wants (decide.model.Action) and the
applier (jobplane.control.reconcile) matches on each. No I/O here.

An action's effects run in the order of ORDER, however the decision listed them: the transition first (a
refused CAS means another run acted, and the rest is skipped) and a debug hold's key, then the flag (one that
exists means another run took the action), the event and the notice, and what changes the world after that; the
console output of VMs whose agent never started is saved before they are terminated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from jobplane.clouds.base import Notice
from jobplane.model.keys import Held, JobData, Limits
from jobplane.model.states import State, StopBy

if TYPE_CHECKING:  # the records' models: a run that decides nothing never imports them
    from jobplane.model import history, records
    from jobplane.model.jobrecord import Updates  # the registry builds records: a run that lists only never does


def _no_updates() -> Updates:
    return {}


@dataclass(frozen=True)
class Transition:
    """CAS job.json to `to`, expecting the state and attempt the run saw (Action.expect, expect_attempt)."""

    to: State
    updates: Updates = field(default_factory=_no_updates)  # other job.json fields the transition sets


@dataclass(frozen=True)
class Flag:
    """Create `key` once: the run that creates it does the rest."""

    key: str


@dataclass(frozen=True)
class Note:
    """Add an event to the job's history."""

    event: history.Event


@dataclass(frozen=True)
class Publish:
    """Publish a notice on the deployment's notification topic."""

    notice: Notice


@dataclass(frozen=True)
class RepairMarkers:
    """Make active/<id>/ agree with job.json again."""


@dataclass(frozen=True)
class SaveConsole:
    """Keep the console output of these VMs with the job's logs: their agent never started."""

    vms: tuple[tuple[int, str], ...]  # (rank, instance id) of the attempt the run saw
    data: JobData | None = None  # where the job's logs are (JobRecord.data); None: jobs/<id>/, as before


@dataclass(frozen=True)
class Terminate:
    instances: tuple[str, ...]


@dataclass(frozen=True)
class Hold:
    """Write the attempt's held-until key: its VMs stay up for a look (the spec's debug_hold) until then."""

    held: Held


@dataclass(frozen=True)
class EndHold:
    """End the billed time job.json still counts for a held attempt's VMs (terminated with it)."""


@dataclass(frozen=True)
class MarkPreempted:
    """Write the job's preempted-jobs/ marker, which queues it for rerun."""

    marker: records.PreemptedMarker


@dataclass(frozen=True)
class WriteLimits:
    """Record the RUNNING attempt's limits in job.json, which renames its marker to carry them, so later checks
    judge it from listings alone (a marker written before the limits rode in its name)."""

    limits: Limits


@dataclass(frozen=True)
class RequestStop:
    """Ask the job's agents to checkpoint and stop (jobs/<id>/control/stop)."""

    by: StopBy = StopBy.UPTIME_CAP  # the request's `by`, which the agent copies into its exit report


@dataclass(frozen=True)
class Relaunch:
    """launcher.launch_attempt: attempt + 1, claimed from the state the transition left (or the one seen)."""

    retry: bool = False  # it retries an error: counted in the record's retries, not its restarts


@dataclass(frozen=True)
class ResumeLaunch:
    """launcher.resume: finish the launch of the attempt whose record carries the event `stamp` (its launcher
    died after the claim)."""

    stamp: str


@dataclass(frozen=True)
class ClearPreempted:
    """Delete the job's preempted-jobs/ marker."""


@dataclass(frozen=True)
class DeleteKeys:
    keys: tuple[str, ...]


Effect = (Transition | Hold | Flag | Note | Publish | RepairMarkers | SaveConsole | Terminate | EndHold | MarkPreempted
          | WriteLimits | RequestStop | Relaunch | ResumeLaunch | ClearPreempted | DeleteKeys)
ORDER: Final[tuple[type[Effect], ...]] = (Transition, Hold, Flag, Note, Publish, RepairMarkers, SaveConsole, Terminate,
                                          EndHold, MarkPreempted, WriteLimits, RequestStop, Relaunch, ResumeLaunch,
                                          ClearPreempted, DeleteKeys)
