"""Job states and the transition table (docs/architecture.md, Job states). Anything not in the table is refused."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class State(StrEnum):
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    WAITING_CAPACITY = "WAITING_CAPACITY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    STALLED = "STALLED"
    INVALID = "INVALID"



class StopBy(StrEnum):
    """Who asked a job to stop: a stop request's `by`, which the agent copies into its exit report. Stored in the
    bucket, so a value never changes (the check's is its function's name)."""

    CLI = "cli"  # jobplane cancel
    UPTIME_CAP = "uptime-cap"  # the uptime cap, its grace before the cap
    IDLE_GPU = "idle-gpu"  # the check's idle-GPU rule with action stop
    CHECK = "sweeper"  # the check: a rank stopped on a stop_on match, the others are asked to stop too
    DEBUG_HOLD = "debug-hold"  # a held attempt's other ranks: they stop, and their VMs stay up
    SWEEP = "sweep"  # a sweep's early-stop rule stopped the trial
    MAX_COST = "max-cost"  # the check: the job's estimated cost reached its max_cost
    UNKNOWN = "unknown"  # the agent could not read the request (it stops all the same)


HOLD_BY: Final = StopBy.DEBUG_HOLD  # a held attempt's other ranks stop, and their VMs stay up
EARLY_STOP: Final = "early-stop"  # an exit report's reason when the agent stopped its job on a stop_on match

TERMINAL = frozenset(
    {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.TIMED_OUT, State.STALLED, State.INVALID}
)
LIVE = frozenset(State) - TERMINAL
# Stopped in these states, a job has run nothing worth a graceful stop: its VMs (if a launch was in flight) are
# terminated at once. From RUNNING on, agents checkpoint, sync and power off.
NOT_STARTED = frozenset({State.QUEUED, State.LAUNCHING, State.WAITING_CAPACITY})

_S = State
TRANSITIONS: frozenset[tuple[State, State]] = frozenset(
    {
        (_S.QUEUED, _S.LAUNCHING),
        (_S.QUEUED, _S.WAITING_CAPACITY),  # over the owner's quota, or no capacity anywhere
        (_S.QUEUED, _S.INVALID),
        (_S.LAUNCHING, _S.RUNNING),  # first heartbeat seen
        (_S.LAUNCHING, _S.LAUNCHING),  # boot timeout, or a retry on an error: terminate, relaunch as attempt + 1
        (_S.LAUNCHING, _S.WAITING_CAPACITY),  # every zone / type refused
        (_S.LAUNCHING, _S.PREEMPTED),  # Spot reclaimed before the first heartbeat
        (_S.LAUNCHING, _S.SUCCEEDED),  # finished before a check saw it running
        (_S.LAUNCHING, _S.FAILED),
        (_S.RUNNING, _S.SUCCEEDED),
        (_S.RUNNING, _S.FAILED),
        (_S.RUNNING, _S.PREEMPTED),
        (_S.RUNNING, _S.LAUNCHING),  # retry on an error (the spec's retry:): attempt + 1
        (_S.PREEMPTED, _S.LAUNCHING),  # rerun: attempt + 1
        (_S.PREEMPTED, _S.WAITING_CAPACITY),
        (_S.PREEMPTED, _S.FAILED),  # no restarts left, or max_wait exceeded
        (_S.WAITING_CAPACITY, _S.LAUNCHING),
        (_S.WAITING_CAPACITY, _S.WAITING_CAPACITY),  # another failed try, next backoff
        (_S.WAITING_CAPACITY, _S.FAILED),  # max_wait exceeded
    }
    | {(live, end) for live in LIVE for end in (_S.CANCELLED, _S.TIMED_OUT, _S.STALLED)}
)


def allowed(src: State, dst: State) -> bool:
    return (src, dst) in TRANSITIONS
