"""The rules the reconcilers decide by, each one line: its name (what a transition records as its cause) and its
facts (the wording of its reason, the metric an applied action counts, the dashboard panel that graphs it). The
members stand in the check's risk order (least risky first: the blast-radius limit lets the head through), and the
order, the metrics and the dashboard's panels are derived from them, so a new rule is one member here, its
decision (a JobRule in decide/check.py's CHECKS for a rule over a live job) and its test rows.

A transition's cause (JobRecord.cause and its event's `cause`, beside the prose reason) is the rule that made it,
or the launcher's decision (LaunchCause): a stable value to act on where the reason is for people. Both are stored
in the bucket: a member's value never changes (old records keep naming it). No imports beyond the standard library:
the launcher's cold start and the CDK app's dashboard load this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias

# The dashboard's panels a rule's metric is graphed in (infra/aws/observability.py adds the other metrics)
RERUNS = "Preemptions and reruns"
ENDS = "Orphans, stalls, timeouts, debug holds"
SAFETY = "Safety: refusals, ignored facts, errors"
IDLE_GPUS = "Idle GPUs and notifications"
SWEEPS = "Sweeps: trials proposed, stopped early; errors"


@dataclass(frozen=True)
class Facts:
    """What is known of a rule besides its decision. `reason` is a str.format template; a field such as {why}
    holds wording that differs between the rule's cases (say, the two ways a boot fails)."""

    reason: str
    metric: str | None = None  # counted once per applied action ...
    panel: str | None = None  # ... graphed on this dashboard panel ...
    per_termination: bool = False  # ... or counted once per instance the action terminated

    def __post_init__(self) -> None:
        if (self.metric is None) != (self.panel is None):
            raise ValueError(f"a rule's metric and its dashboard panel come together: {self}")


class Rule(StrEnum):
    """Least risky first, which is the check's order. The members after CLEANUP are rerun's and the uptime cap's,
    which keep the order they decide in, and the sweeps' early stop."""

    facts: Facts

    def __new__(cls, value: str, facts: Facts) -> Rule:
        member = str.__new__(cls, value)
        member._value_ = value
        member.facts = facts
        return member

    IGNORED = "ignored", Facts("ignored {fact}: {why}", "IgnoredFacts", SAFETY)  # a fact that does not parse or
    # names no instance of the attempt: an event, once
    FINISHED = "finished", Facts("{exited}")  # "every rank exited 0", or which rank exited with which code
    STOPPED = "stopped", Facts("stopped at the uptime cap ({cap})", "Timeouts", ENDS)  # every rank exited on the
    # uptime cap's stop request
    COST_STOPPED = "max-cost", Facts("stopped at its max_cost: {spent} of {cap} (max_cost)", "CostStops", ENDS)
    # every rank exited on the max_cost stop request, or the stop grace after it is over: FAILED
    EARLY_STOP = "early-stop", Facts("stopped: {why}{rank}")  # every rank exited, one on a stop_on match: FAILED
    IDLE_STOPPED = "idle-stopped", Facts("stopped for idle GPUs: {why}")  # on an idle-GPU stop request
    RANK_FAILED = "rank-failed", Facts("{exited}; ending the attempt (terminating rank {running})")
    COST_STOP = "cost-stop", Facts("max_cost {cap} reached ({spent} so far): stop requested")  # checkpoint, stop
    STOP_PEERS = "stop-peers", Facts("rank {rank} stopped ({error}): asking rank {running} to stop")
    STARTED = "started", Facts("every rank has sent a heartbeat")  # LAUNCHING -> RUNNING
    RESUME_LAUNCH = "resume-launch", Facts("attempt {attempt} has no VM recorded {after} after its claim: resuming "
                                           "its launch")
    LIMITS = "limits", Facts("record per-job limits for listing-only checks")  # a RUNNING attempt's limits/ key
    IDLE = "idle-gpu", Facts("GPU utilization under {threshold:g}% on every rank for {window}{then}", "IdleGpuJobs",
                             IDLE_GPUS)  # flag (warn), or flag and stop
    REPAIR = "repair", Facts("active/ markers disagree with job.json")
    REMARK = "remark", Facts("PREEMPTED without a preempted-jobs/ marker: writing it again")
    LOST = "lost", Facts("lost: {what} vanished")
    LOST_SPOT = "lost-spot", Facts("Spot capacity lost: {what} gone")
    STALLED = "stalled", Facts("{why} (stall_timeout {stall})", "Stalls", ENDS)
    RETRY = "retry", Facts("retry {number} of {of}: {why}; relaunching as attempt {next}", "Reruns", RERUNS)  # an
    # attempt ended in an error the spec's retry: names: terminate, relaunch (a retry counted)
    BOOT_FAILED = "boot-failed", Facts("{why}")  # the bootstrap's report, or a boot timeout with no restarts left
    BOOT_RETRY = "boot-retry", Facts("{why}; retrying as attempt {next}", "Reruns", RERUNS)
    HOLD_OVER = "hold-over", Facts("debug hold of attempt {attempt} over at {until}: terminating {instances}",
                                   "HeldTerminated", ENDS, per_termination=True)  # a FAILED attempt's hold is over
    ORPHAN = "orphan", Facts("orphan {instance}: {why}", "OrphansTerminated", ENDS, per_termination=True)
    CLEANUP = "cleanup", Facts("{count} heartbeat/limits keys of past attempts")  # of jobs no longer live
    PREEMPTED = "preempted", Facts("the agent reported a preemption")  # rerun: of a RUNNING job
    RERUN = "rerun", Facts("preempted; rerun as attempt {next}", "Reruns", RERUNS)
    RERUN_EXHAUSTED = "rerun-exhausted", Facts("preempted; {why}")
    CLEAR = "clear", Facts("{why}")  # a preempted-jobs/ marker nobody needs any more, and why it is stale
    STOP = "stop", Facts("uptime cap {cap} in {left}: stop requested")  # uptime cap - grace: checkpoint and stop
    TIMED_OUT = "timed-out", Facts("uptime cap {cap} reached", "Timeouts", ENDS)
    CAP_NO_JOB = "cap-no-job", Facts("{instance} has no live job and ran past the policy ceiling {ceiling}",
                                     "OrphansTerminated", ENDS, per_termination=True)
    SWEEP_STOP = "sweep-early-stop", Facts("{why}", "SweepTrialsStopped", SWEEPS)  # a sweep's early-stop rule
    # stopped a live trial: CANCELLED (jobplane.sweeps; the rule, and the values it compared: decide.trials)

    def reason(self, **fields: object) -> str:
        """This rule's reason, its template filled in."""
        return self.facts.reason.format(**fields)


class LaunchCause(StrEnum):
    """Why the launcher moved a job (its transitions that no reconciler's rule asked for)."""

    SUBMITTED = "submitted"  # a queue drop's first claim
    WAIT_OVER = "capacity-wait-over"  # a capacity or quota wait is over: claimed again
    LAUNCHED = "launched"  # the attempt's VMs are recorded (launched, or adopted after its launcher died)
    NO_CAPACITY = "no-capacity"  # every zone and instance type refused: WAITING_CAPACITY
    OVER_QUOTA = "over-quota"  # the owner's instance quota: WAITING_CAPACITY
    OVER_BUDGET = "over-budget"  # the owner's budget this month: FAILED, or WAITING_CAPACITY (budgets.on_exceeded)
    MAX_WAIT = "max-wait"  # still no capacity (or quota) at max_wait: FAILED
    NO_AGENT = "no-agent-bundle"  # the deployment has no agent bundle for the VMs: FAILED
    REJECTED = "launch-rejected"  # the cloud refused the request itself (an image, an account quota): FAILED
    LAUNCH_ERROR = "launch-error"  # deciding the launch raised (a bug, a value out of range): FAILED with the error
    INVALID = "invalid"  # the spec breaks the policy or the deployment: INVALID
    AFTER = "waiting-for-dependency"  # a job its `after:` names has not SUCCEEDED yet: WAITING_CAPACITY
    DEPENDENCY_FAILED = "dependency-failed"  # a job its `after:` names ended otherwise: FAILED
    NEVER_FITS = "never-fits"  # a waiting job the policy in force can never admit (a quota or cap lowered): FAILED


Cause: TypeAlias = Rule | LaunchCause

ORDER: Final[Mapping[Rule, int]] = {rule: n for n, rule in enumerate(Rule)}


def panels() -> dict[str, list[str]]:
    """The dashboard's panels the rules' metrics are graphed on: title -> metric names, each once, in rule order."""
    out: dict[str, list[str]] = {}
    for rule in Rule:
        facts = rule.facts
        if facts.metric and facts.panel and facts.metric not in out.setdefault(facts.panel, []):
            out[facts.panel].append(facts.metric)
    return out
