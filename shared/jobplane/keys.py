"""Registry key layout (docs/architecture.md). Every key the control plane or an agent touches is built here.

Deliberate shapes, so a sweep needs listings only (no per-job GET):
- `active/<id>/<STATE>.<attempt>`: the marker's key carries the state and attempt, so one listing of
  `active/` gives the sweep its whole working set. The `active/<id>` prefix exists iff the job is live.
- `heartbeats/<id>/<attempt>/<rank>` (liveness = LastModified) and `.../<rank>.output` (rewritten only
  when the user process printed something new): one listing of `heartbeats/` covers every job.
- `limits/<id>/<attempt>/nodes-<n>.stall-<s>.cap-<s>`: a RUNNING job's node count, stall timeout and
  uptime cap in the key name, written by the sweeper when the job starts, so the sweep and the uptime cap
  apply per-job timeouts from a listing (see jobplane.decide).
- `heartbeats/<id>/<attempt>/<rank>.idle`: rewritten by the agent with each heartbeat while the rank's mean
  GPU utilization over the policy's window is under its threshold; `limits/<id>/<attempt>/idle-flagged`,
  created once by the sweeper that flagged the attempt idle. Both are seen in listings the sweep makes anyway.
"""

from __future__ import annotations

JOB_ID_PATTERN = r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"

QUEUE = "queue/"
REJECTED = "rejected/"
JOBS = "jobs/"
ACTIVE = "active/"
PREEMPTED = "preempted-jobs/"
HEARTBEATS = "heartbeats/"
SYSTEM = "system/"
LIMITS = "limits/"
CODE = "code/"
POLICY = "config/policy.yaml"


def queue_entry(job_id: str, ext: str = "yaml") -> str:
    return f"{QUEUE}{job_id}.{ext}"


def rejected_spec(job_id: str, ext: str = "yaml") -> str:
    return f"{REJECTED}{job_id}.{ext}"


def rejected_error(job_id: str) -> str:
    return f"{REJECTED}{job_id}.error.json"


def job_prefix(job_id: str) -> str:
    return f"{JOBS}{job_id}/"


def job_record(job_id: str) -> str:
    return f"{JOBS}{job_id}/job.json"


def events_prefix(job_id: str) -> str:
    return f"{JOBS}{job_id}/events/"


def event(job_id: str, stamp: str, kind: str) -> str:
    return f"{JOBS}{job_id}/events/{stamp}-{kind}.json"


def code_prefix(job_id: str) -> str:
    return f"{JOBS}{job_id}/code/"


def code_bundle(job_id: str) -> str:
    return f"{JOBS}{job_id}/code/code.tar.gz"


def code_upload(owner: str, job_id: str) -> str:
    """Where `jobplane submit` puts a job's code bundle: under its owner's code/<owner>/, like its drop."""
    return f"{CODE}{owner}/{job_id}.tar.gz"


def attempt_prefix(job_id: str, attempt: int) -> str:
    return f"{JOBS}{job_id}/attempts/{attempt}/"


def cluster(job_id: str, attempt: int) -> str:
    return f"{JOBS}{job_id}/attempts/{attempt}/cluster.json"


def boot_failure(job_id: str, attempt: int) -> str:
    """Written by a VM's bootstrap (through a URL the launcher made) when the agent could not start."""
    return f"{JOBS}{job_id}/attempts/{attempt}/boot-failure.json"


def ignored_flag(job_id: str, attempt: int, fact: str) -> str:
    """Created once by the function that recorded an event for a fact of this attempt it ignored (an exit
    report or boot failure that does not parse or names no instance of the attempt): one event per fact."""
    return f"{JOBS}{job_id}/attempts/{attempt}/ignored/" + fact.removeprefix(attempt_prefix(job_id, attempt)) \
        .replace("/", ".")


def exits_prefix(job_id: str, attempt: int) -> str:
    return f"{JOBS}{job_id}/attempts/{attempt}/nodes/"


def exit_report(job_id: str, attempt: int, rank: int) -> str:
    return f"{JOBS}{job_id}/attempts/{attempt}/nodes/{rank}/exit.json"


def _per_node(area: str, job_id: str, attempt: int | None, rank: int | None) -> str:
    key = f"{JOBS}{job_id}/{area}/"
    if attempt is not None:
        key += f"{attempt}/"
        if rank is not None:
            key += f"{rank}/"
    return key


def logs_prefix(job_id: str, attempt: int | None = None, rank: int | None = None) -> str:
    return _per_node("logs", job_id, attempt, rank)


def log_chunk(job_id: str, attempt: int, rank: int, seq: int) -> str:
    # zero-padded so key order is write order
    return f"{logs_prefix(job_id, attempt, rank)}{seq:08d}.log"


def metrics_prefix(job_id: str, attempt: int | None = None, rank: int | None = None) -> str:
    return _per_node("metrics", job_id, attempt, rank)


def metrics_chunk(job_id: str, attempt: int, rank: int, seq: int) -> str:
    """Metric points (JSON Lines) the agent read from the output, shipped with the log chunks."""
    return f"{metrics_prefix(job_id, attempt, rank)}{seq:08d}.jsonl"


def console_log(job_id: str, attempt: int, rank: int) -> str:
    """A VM's console output, saved by the sweeper when its agent never started; sorts after the chunks."""
    return f"{logs_prefix(job_id, attempt, rank)}console.log"


def checkpoints_prefix(job_id: str) -> str:
    return f"{JOBS}{job_id}/checkpoints/"


def artifacts_prefix(job_id: str) -> str:
    return f"{JOBS}{job_id}/artifacts/"


def stop_request(job_id: str) -> str:
    return f"{JOBS}{job_id}/control/stop"


def active_prefix(job_id: str) -> str:
    return f"{ACTIVE}{job_id}/"


def active_marker(job_id: str, state: str, attempt: int) -> str:
    return f"{ACTIVE}{job_id}/{state}.{attempt}"


def preempted_marker(job_id: str) -> str:
    return f"{PREEMPTED}{job_id}"


def heartbeats_prefix(job_id: str, attempt: int | None = None) -> str:
    return f"{HEARTBEATS}{job_id}/" + (f"{attempt}/" if attempt is not None else "")


def heartbeat(job_id: str, attempt: int, rank: int) -> str:
    return f"{HEARTBEATS}{job_id}/{attempt}/{rank}"


def output_mark(job_id: str, attempt: int, rank: int) -> str:
    return f"{HEARTBEATS}{job_id}/{attempt}/{rank}.output"


def idle_mark(job_id: str, attempt: int, rank: int) -> str:
    return f"{HEARTBEATS}{job_id}/{attempt}/{rank}.idle"


AGENT = f"{SYSTEM}agent/"  # the agent bundles and their manifest (jobplane.agent_bundle)


def agent_file(name: str) -> str:
    return f"{AGENT}{name}"


def limits_mark(job_id: str, attempt: int, nodes: int, stall: int, cap: int) -> str:
    return f"{LIMITS}{job_id}/{attempt}/nodes-{nodes}.stall-{stall}.cap-{cap}"


IDLE_FLAGGED = "idle-flagged"


def idle_flag(job_id: str, attempt: int) -> str:
    return f"{LIMITS}{job_id}/{attempt}/{IDLE_FLAGGED}"
