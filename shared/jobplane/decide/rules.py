"""The rules the reconcilers decide by, and what is known of each in one table (RULES): where it stands in the
check's risk order, the metric an applied action counts, and the wording of its reason. The check's order and
the applier's metric names are derived from it, so a new rule is one member, one row and its decision.

A transition's cause (JobRecord.cause and its event's `cause`, beside the prose reason) is the rule that made it,
or the launcher's decision (LaunchCause): a stable value to act on where the reason is for people. No imports
beyond the standard library: the registry and the launcher's cold start load this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias


class Rule(StrEnum):
    IGNORED = "ignored"  # a fact that does not parse or names no instance of the attempt: an event, once
    STARTED = "started"  # LAUNCHING -> RUNNING: every rank has beaten
    RESUME_LAUNCH = "resume-launch"  # LAUNCHING with no VM recorded past the grace: adopt its VMs or launch them
    LIMITS = "limits"  # write the limits/ key of a RUNNING attempt
    FINISHED = "finished"
    RANK_FAILED = "rank-failed"  # a rank of a multi-node attempt exited non-zero: the attempt ends at once
    STOPPED = "stopped"  # every rank exited on a stop request: the uptime cap's
    EARLY_STOP = "early-stop"  # every rank exited and one on a stop_on match: FAILED with it, never rerun
    STOP_PEERS = "stop-peers"  # a rank stopped on a stop_on match: ask the others to stop too
    ORPHAN = "orphan"
    STALLED = "stalled"
    BOOT_RETRY = "boot-retry"
    BOOT_FAILED = "boot-failed"
    LOST_SPOT = "lost-spot"
    LOST = "lost"
    REPAIR = "repair"  # active/ markers disagree with job.json
    REMARK = "remark"  # PREEMPTED without its preempted-jobs/ marker
    CLEANUP = "cleanup"  # heartbeats / limits of jobs that are no longer live
    PREEMPTED = "preempted"  # rerun: the agent reported a preemption of a RUNNING job
    RERUN = "rerun"
    RETRY = "retry"  # an attempt ended in an error the spec's retry: names: terminate, relaunch (a retry counted)
    RERUN_EXHAUSTED = "rerun-exhausted"
    CLEAR = "clear"  # a preempted-jobs/ marker nobody needs any more
    STOP = "stop"  # uptime cap - grace: ask the agent to checkpoint and stop
    TIMED_OUT = "timed-out"
    CAP_NO_JOB = "cap-no-job"
    IDLE = "idle-gpu"  # every rank's GPUs idle over the policy window: flag (warn), or flag and stop
    IDLE_STOPPED = "idle-stopped"  # every rank exited on an idle-GPU stop request
    HOLD_OVER = "hold-over"  # a FAILED attempt's debug hold is over: terminate the VMs it kept
    SWEEP_STOP = "sweep-early-stop"  # a sweep's early-stop rule stopped a live trial: CANCELLED (jobplane.sweeps)

    def reason(self, **fields: object) -> str:
        """This rule's reason, its table row's template filled in."""
        return RULES[self].reason.format(**fields)


@dataclass(frozen=True)
class Facts:
    """One rule's row. `reason` is a str.format template; a field such as {why} holds wording that differs
    between the rule's cases (say, the two ways a boot fails)."""

    reason: str
    metric: str | None = None  # counted once per applied action ...
    per_termination: bool = False  # ... or once per instance the action terminated


# Least risky first, which is the check's order: the blast-radius limit lets the head of the list through. The
# rows after CLEANUP are rerun's and the uptime cap's, which keep the order they decide in.
RULES: Final[Mapping[Rule, Facts]] = {
    Rule.IGNORED: Facts("ignored {fact}: {why}", "IgnoredFacts"),
    Rule.FINISHED: Facts("{exited}"),  # "every rank exited 0", or which rank exited with which code
    Rule.STOPPED: Facts("stopped at the uptime cap ({cap})", "Timeouts"),
    Rule.EARLY_STOP: Facts("stopped: {why}{rank}"),
    Rule.IDLE_STOPPED: Facts("stopped for idle GPUs: {why}"),
    Rule.RANK_FAILED: Facts("{exited}; ending the attempt (terminating rank {running})"),
    Rule.STOP_PEERS: Facts("rank {rank} stopped ({error}): asking rank {running} to stop"),
    Rule.STARTED: Facts("every rank has sent a heartbeat"),
    Rule.RESUME_LAUNCH: Facts("attempt {attempt} has no VM recorded {after} after its claim: resuming its launch"),
    Rule.LIMITS: Facts("record per-job limits for listing-only checks"),
    Rule.IDLE: Facts("GPU utilization under {threshold:g}% on every rank for {window}{then}", "IdleGpuJobs"),
    Rule.REPAIR: Facts("active/ markers disagree with job.json"),
    Rule.REMARK: Facts("PREEMPTED without a preempted-jobs/ marker: writing it again"),
    Rule.LOST: Facts("lost: {what} vanished"),
    Rule.LOST_SPOT: Facts("Spot capacity lost: {what} gone"),
    Rule.STALLED: Facts("{why} (stall_timeout {stall})", "Stalls"),
    Rule.RETRY: Facts("retry {number} of {of}: {why}; relaunching as attempt {next}", "Reruns"),
    Rule.BOOT_FAILED: Facts("{why}"),  # the bootstrap's report, or a boot timeout with no restarts left
    Rule.BOOT_RETRY: Facts("{why}; retrying as attempt {next}", "Reruns"),
    Rule.HOLD_OVER: Facts("debug hold of attempt {attempt} over at {until}: terminating {instances}",
                          "HeldTerminated", per_termination=True),
    Rule.ORPHAN: Facts("orphan {instance}: {why}", "OrphansTerminated", per_termination=True),
    Rule.CLEANUP: Facts("{count} heartbeat/limits keys of past attempts"),
    Rule.PREEMPTED: Facts("the agent reported a preemption"),
    Rule.RERUN: Facts("preempted; rerun as attempt {next}", "Reruns"),
    Rule.RERUN_EXHAUSTED: Facts("preempted; {why}"),
    Rule.CLEAR: Facts("{why}"),  # why the marker is stale
    Rule.STOP: Facts("uptime cap {cap} in {left}: stop requested"),
    Rule.TIMED_OUT: Facts("uptime cap {cap} reached", "Timeouts"),
    Rule.CAP_NO_JOB: Facts("{instance} has no live job and ran past the policy ceiling {ceiling}", "OrphansTerminated",
                           per_termination=True),
    Rule.SWEEP_STOP: Facts("{why}"),  # the rule, and the values it compared (decide.trials)
}
if set(RULES) != set(Rule):  # a rule without a row would be unordered, uncounted and unworded
    raise RuntimeError(f"rules without a row in RULES: {sorted(set(Rule) - set(RULES))}")

class LaunchCause(StrEnum):
    """Why the launcher moved a job (its transitions that no reconciler's rule asked for)."""

    SUBMITTED = "submitted"  # a queue drop's first claim
    WAIT_OVER = "capacity-wait-over"  # a capacity or quota wait is over: claimed again
    LAUNCHED = "launched"  # the attempt's VMs are recorded (launched, or adopted after its launcher died)
    NO_CAPACITY = "no-capacity"  # every zone and instance type refused: WAITING_CAPACITY
    OVER_QUOTA = "over-quota"  # the owner's instance quota: WAITING_CAPACITY
    MAX_WAIT = "max-wait"  # still no capacity (or quota) at max_wait: FAILED
    NO_AGENT = "no-agent-bundle"  # the deployment has no agent bundle for the VMs: FAILED
    REJECTED = "launch-rejected"  # the cloud refused the request itself (an image, an account quota): FAILED
    LAUNCH_ERROR = "launch-error"  # deciding the launch raised (a bug, a value out of range): FAILED with the error
    INVALID = "invalid"  # the spec breaks the policy or the deployment: INVALID


Cause: TypeAlias = Rule | LaunchCause

ORDER: Final[Mapping[Rule, int]] = {rule: n for n, rule in enumerate(RULES)}
METRICS: Final[Mapping[Rule, str]] = {rule: facts.metric for rule, facts in RULES.items() if facts.metric}
