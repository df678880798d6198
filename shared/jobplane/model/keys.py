"""Registry key layout (docs/architecture.md). Every key the control plane or an agent touches is built here,
and every key a listing or an event hands back is parsed here: `parse_*` gives the parts of a key of that kind,
or None for any other key (a foreign key, a folder placeholder, a key of another version).

Deliberate shapes, so a check needs listings only (no per-job GET):
- `active/<id>/<STATE>.<attempt>`: the marker's key carries the state and attempt, so one listing of
  `active/` gives the check its whole working set. The `active/<id>/` prefix exists iff the job is live.
  A RUNNING marker also carries the attempt's node count, stall timeout and uptime cap (and the numbers the
  check's rules read), `RUNNING.<attempt>.nodes-<n>.stall-<s>.cap-<s>[.<name>-<v>...]`, set when the job
  starts (job.json's `limits`), so the check and the uptime cap apply per-job timeouts from that listing. A
  RUNNING marker written before carries none: the check reads those from `limits/<id>/<attempt>/nodes-...`.
- `heartbeats/<id>/<attempt>/<rank>` (liveness = LastModified) and `.../<rank>.output` (rewritten only
  when the user process printed something new): one listing of `heartbeats/` covers every job.
- `heartbeats/<id>/<attempt>/<rank>.idle`: rewritten by the agent with each heartbeat while the rank's mean
  GPU utilization over the policy's window is under its threshold; `active/<id>.<attempt>.idle-flagged`,
  created once by the check that flagged the attempt idle. Both are seen in listings the check makes anyway.
- `active/<id>.<attempt>.held-until-<epoch s>`: a FAILED attempt whose VMs its spec's `debug_hold` keeps for a
  look, and until when: the check spares them (no orphan) and terminates them at that time, from its listing.
  Beside `active/<id>/`, not in it, so it outlives the job's markers; only functions write under `active/`.
- `limits/<id>/<attempt>/...`: where the limits, the idle flag and the held-until key were written before they
  moved under `active/`; read only while a marker or a VM needs them (`needs_old_limits`), never written.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from jobplane.model.states import State

JOB_ID_PATTERN = r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"
LABEL_KEY = r"^[a-z][a-z0-9_-]{0,62}$"  # a label key, an owner (code/<owner>/), a priority class

QUEUE = "queue/"
REJECTED = "rejected/"
JOBS = "jobs/"
# teams/<owner>/<id>/: a job's own data (logs, metrics, system samples, TensorBoard files, checkpoints, artifacts,
# code), under its owner so that IAM lets that owner's people, and no other team's, read it (JobData)
TEAMS = "teams/"
CANCELS = "cancels/"  # cancels/<owner>/<id>: a team member's request that the functions cancel its job
ACTIVE = "active/"
PREEMPTED = "preempted-jobs/"
HEARTBEATS = "heartbeats/"
SYSTEM = "system/"
LIMITS = "limits/"
CODE = "code/"
SWEEPS = "sweeps/"
ACTIVE_SWEEPS = "active-sweeps/"
AFTER = "after/"  # after/<dependency>/<job>: a job waiting for another to end (jobplane.decide.dependencies)
ADMISSION = "admission/"  # the admission records: who holds which nodes of a quota (jobplane.model.admission)
ADMISSION_DEPLOYMENT = f"{ADMISSION}deployment.json"  # the deployment-wide cap's, when the policy sets one
ADMISSION_OWNERS = f"{ADMISSION}owners/"
ADMISSION_FAMILIES = f"{ADMISSION}families/"  # an instance family's cap's (max_active_by_family)
BUDGET_NOTICES = "budget-notices/"  # <YYYY-MM>/<owner>.<level>: an owner was told its spend reached a level
POLICY = "config/policy.yaml"
DEFAULT_OWNER = "default"  # the owner of a drop straight under queue/ (a single-team deployment)
AGENT = f"{SYSTEM}agent/"  # the agent bundles and their manifest (jobplane.boot.agent_bundle)
IDLE_FLAGGED = "idle-flagged"
HELD_UNTIL = "held-until-"
TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")  # a `code:` key ending so is one bundle to unpack, else a folder

# What parsers accept for a key's parts: one path segment (a job id), a number as builders write it.
_ID = r"([^/]+)"
_N = r"(0|[1-9][0-9]*)"
_STAMP = r"([0-9]{8}T[0-9]{6}\.[0-9]{6}Z-[0-9a-f]+)"


def root_prefix(root: str) -> str:
    """A registry root ("team-x", "/team-x/", "") as the prefix its keys start with ("team-x/", "")."""
    return root.strip("/") + "/" if root.strip("/") else ""


def split_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix or gs://... -> (bucket, "some/prefix")."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    if not sep or not scheme or not bucket:
        raise ValueError(f"{uri!r} is not a bucket URI (s3://bucket/prefix or gs://bucket/prefix)")
    return bucket, prefix


# ---- building ----------------------------------------------------------------------------------------------
def queue_entry(job_id: str, owner: str = DEFAULT_OWNER, ext: str = "yaml") -> str:
    """Where a job's drop goes: queue/<owner>/<job-id>.yaml, or queue/<job-id>.yaml for the default owner."""
    return f"{QUEUE}{job_id}.{ext}" if owner == DEFAULT_OWNER else f"{QUEUE}{owner}/{job_id}.{ext}"


def rejected_spec(job_id: str, ext: str = "yaml") -> str:
    return f"{REJECTED}{job_id}.{ext}"


def rejected_error(job_id: str) -> str:
    return f"{REJECTED}{job_id}.error.json"


def _in_job(rest: str) -> Callable[[str], str]:
    """The builder of jobs/<id>/<rest>: the keys of a job that name nothing but the job."""

    def build(job_id: str) -> str:
        return f"{JOBS}{job_id}/{rest}"

    return build


job_prefix = _in_job("")
job_record = _in_job("job.json")
events_prefix = _in_job("events/")
stop_request = _in_job("control/stop")

# job.json's `layout`: a record this version creates keeps its job's data under teams/<owner>/<id>/; a record
# without it (layout 1, written before) under jobs/<id>/, where its agents wrote it
DATA_LAYOUT = 2


@dataclass(frozen=True)
class JobData:
    """Where one job's own data lives (its logs, metrics, system samples, TensorBoard files, checkpoints, artifacts
    and code): teams/<owner>/<id>/, which IAM lets that owner's people read and no other team's; for a job recorded
    before (owner None), jobs/<id>/ as before. JobRecord.data says which a record's job uses."""

    job_id: str
    owner: str | None = None

    @property
    def folder(self) -> str:
        return f"{TEAMS}{self.owner}/{self.job_id}/" if self.owner is not None else f"{JOBS}{self.job_id}/"


# the areas of a job's data folder its agents write (code/ is read-only to them)
DATA_AREAS = ("logs/", "metrics/", "system/", "tensorboard/", "checkpoints/", "artifacts/")


def data_prefixes(data: JobData) -> tuple[str, ...]:
    """The prefixes a job's agents write its data under: its teams/<owner>/<id>/ whole; for a job recorded before,
    the data areas of its jobs/<id>/, which holds its record too."""
    return (data.folder,) if data.owner is not None else tuple(data.folder + area for area in DATA_AREAS)


def team_folder(owner: str) -> str:
    """An owner's jobs' data: teams/<owner>/ (JobData)."""
    return f"{TEAMS}{owner}/"


def code_prefix(data: JobData) -> str:
    return f"{data.folder}code/"


def code_bundle(data: JobData) -> str:
    """A job's code when its spec names none."""
    return f"{data.folder}code/code.tar.gz"


def checkpoints_prefix(data: JobData) -> str:
    return f"{data.folder}checkpoints/"


def artifacts_prefix(data: JobData) -> str:
    return f"{data.folder}artifacts/"


def cancel_request(owner: str, job_id: str) -> str:
    """Where a team member asks the functions to cancel one of its owner's jobs (it may not write job.json)."""
    return f"{CANCELS}{owner}/{job_id}"


def stamp(now: datetime, token: str | None = None) -> str:
    """An event's sortable, unique-enough stamp: 20261122T050421.123456Z-ab12 (token: 4 random hex digits)."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ") + "-" + (token or secrets.token_hex(2))


def event(job_id: str, stamp: str, kind: str) -> str:
    return f"{JOBS}{job_id}/events/{stamp}-{kind}.json"


def of_job(key: str, root: str, job_id: str) -> bool:
    """The key (bucket-relative) is one of the job's own: under its record's folder, its heartbeats or its data
    folder (of whichever owner: an agent asks for its own keys before it has read its record)."""
    rest = key.removeprefix(root_prefix(root))
    if rest.startswith((f"{JOBS}{job_id}/", heartbeats_prefix(job_id))):
        return True
    owner, _, tail = rest.removeprefix(TEAMS).partition("/") if rest.startswith(TEAMS) else ("", "", "")
    return bool(owner) and tail.startswith(f"{job_id}/")


def waiting_for(dependency: str, job_id: str = "") -> str:
    """The mark of `job_id` waiting for `dependency` to end (without a job: the prefix of all that wait for it)."""
    return f"{AFTER}{dependency}/{job_id}"


def admission_owner(owner: str) -> str:
    """The admission record of one owner's quota (max_active_instances_per_owner)."""
    return f"{ADMISSION_OWNERS}{owner}.json"


def admission_family(family: str) -> str:
    """The admission record of one instance family's cap (max_active_by_family)."""
    return f"{ADMISSION_FAMILIES}{family}.json"


def budget_notice(month: str, owner: str, level: str) -> str:
    """Written create-only by the run that tells `owner` its spend reached `level` in `month`: told once."""
    return f"{BUDGET_NOTICES}{month}/{owner}.{level}"


def code_folder(owner: str) -> str:
    """An owner's code bundles: the one registry folder, besides its own jobs/<id>/code/, a job reads code from."""
    return f"{CODE}{owner}/"


def code_upload(owner: str, job_id: str) -> str:
    """Where `jobplane submit` puts a job's code bundle: under its owner's code/<owner>/, like its drop."""
    return f"{code_folder(owner)}{job_id}.tar.gz"


def attempt_prefix(job_id: str, attempt: int) -> str:
    return f"{JOBS}{job_id}/attempts/{attempt}/"


def cluster(job_id: str, attempt: int) -> str:
    return f"{attempt_prefix(job_id, attempt)}cluster.json"


def boot_failure(job_id: str, attempt: int) -> str:
    """Written by a VM's bootstrap (through a URL the launcher made) when the agent could not start."""
    return f"{attempt_prefix(job_id, attempt)}boot-failure.json"


def ignored_flag(job_id: str, attempt: int, fact: str) -> str:
    """Created once by the function that recorded an event for a fact of this attempt it ignored (an exit report or
    boot failure that does not parse or names no instance of the attempt; the attempt's prefix, `excess`: what it
    holds beyond what a check reads): one event per fact. fact "": the flags' folder."""
    rest = fact.removeprefix(attempt_prefix(job_id, attempt)).replace("/", ".")
    return f"{JOBS}{job_id}/attempts/{attempt}/ignored/" + (rest or ("excess" if fact else ""))


def exits_prefix(job_id: str, attempt: int) -> str:
    return f"{attempt_prefix(job_id, attempt)}nodes/"


def exit_report(job_id: str, attempt: int, rank: int) -> str:
    return f"{exits_prefix(job_id, attempt)}{rank}/exit.json"


def node_prefix(area: str, data: JobData, attempt: int | None = None, rank: int | None = None) -> str:
    """The job's <area>/ in its data folder, optionally narrowed to an attempt and one of its ranks (area: logs,
    metrics, system or tensorboard)."""
    key = f"{data.folder}{area}/"
    if attempt is not None:
        key += f"{attempt}/"
        if rank is not None:
            key += f"{rank}/"
    return key


def logs_prefix(data: JobData, attempt: int | None = None, rank: int | None = None) -> str:
    return node_prefix("logs", data, attempt, rank)


def log_chunk(data: JobData, attempt: int, rank: int, seq: int) -> str:
    # zero-padded so key order is write order
    return f"{logs_prefix(data, attempt, rank)}{seq:08d}.log"


def metrics_prefix(data: JobData, attempt: int | None = None, rank: int | None = None) -> str:
    return node_prefix("metrics", data, attempt, rank)


def metrics_chunk(data: JobData, attempt: int, rank: int, seq: int) -> str:
    """Metric points (JSON Lines) the agent read from the output, shipped with the log chunks."""
    return f"{metrics_prefix(data, attempt, rank)}{seq:08d}.jsonl"


def system_prefix(data: JobData, attempt: int | None = None, rank: int | None = None) -> str:
    return node_prefix("system", data, attempt, rank)


def system_chunk(data: JobData, attempt: int, rank: int, seq: int) -> str:
    """System metric samples (JSON Lines, model/sysmetrics.py) the agent took, apart from the job's own metrics."""
    return f"{system_prefix(data, attempt, rank)}{seq:08d}.jsonl"


def tensorboard_prefix(data: JobData, attempt: int | None = None, rank: int | None = None) -> str:
    """The job's TensorBoard event files, as its `tensorboard.log_dir` holds them, per attempt and rank."""
    return node_prefix("tensorboard", data, attempt, rank)


def console_log(data: JobData, attempt: int, rank: int) -> str:
    """A VM's console output, saved by the check when its agent never started; sorts after the chunks."""
    return f"{logs_prefix(data, attempt, rank)}console.log"


def active_prefix(job_id: str) -> str:
    return f"{ACTIVE}{job_id}/"


def active_marker(job_id: str, state: str, attempt: int, limits: str | None = None) -> str:
    """The live job's marker; `limits` (a RUNNING attempt's, `Limits.tail`) ride in its name."""
    return f"{ACTIVE}{job_id}/{state}.{attempt}" + (f".{limits}" if limits else "")


def preempted_marker(job_id: str) -> str:
    return f"{PREEMPTED}{job_id}"


def heartbeats_prefix(job_id: str, attempt: int | None = None) -> str:
    return f"{HEARTBEATS}{job_id}/" + (f"{attempt}/" if attempt is not None else "")


def heartbeat(job_id: str, attempt: int, rank: int, mark: str = "") -> str:
    """A rank's heartbeat, or with `mark` its `.output` / `.idle` mark beside it."""
    return f"{HEARTBEATS}{job_id}/{attempt}/{rank}" + (f".{mark}" if mark else "")


def output_mark(job_id: str, attempt: int, rank: int) -> str:
    return heartbeat(job_id, attempt, rank, "output")


def idle_mark(job_id: str, attempt: int, rank: int) -> str:
    return heartbeat(job_id, attempt, rank, "idle")


def agent_file(name: str) -> str:
    return f"{AGENT}{name}"


_FACT = r"[a-z][a-z0-9]{0,15}"  # a number a check rule's filter reads from the limits key: its name
LIMITS_FACTS = 8  # at most this many, so the key stays short


def limits_tail(nodes: int, stall: int, cap: int, facts: tuple[tuple[str, int], ...] = ()) -> str:
    """`nodes-N.stall-S.cap-C[.name-V...]`: a RUNNING attempt's limits as its marker's name carries them; `facts`
    are the numbers the check's rules read from it beside nodes, stall and cap (each rule's own:
    decide.jobrule.JobRule.limits)."""
    if len(facts) > LIMITS_FACTS or any(not re.fullmatch(_FACT, n) or n in ("nodes", "stall", "cap") or v < 0
                                        for n, v in facts):
        raise ValueError(f"limits facts: at most {LIMITS_FACTS} names {_FACT} (not nodes, stall or cap) with "
                         f"numbers >= 0, not {facts}")
    extra = "".join(f".{name}-{value}" for name, value in facts)
    return f"nodes-{nodes}.stall-{stall}.cap-{cap}{extra}"


def limits_mark(job_id: str, attempt: int, nodes: int, stall: int, cap: int,
                facts: tuple[tuple[str, int], ...] = ()) -> str:
    """The limits/ key written before the limits moved into the RUNNING marker (read, and deleted, only)."""
    return f"{LIMITS}{job_id}/{attempt}/{limits_tail(nodes, stall, cap, facts)}"


def held_mark(job_id: str, attempt: int, until: datetime, *, old: bool = False) -> str:
    # rounded up: the check reads the hold's end from this name alone, and a hold must not end before its time
    epoch = math.ceil(until.timestamp())
    return f"{LIMITS}{job_id}/{attempt}/{HELD_UNTIL}{epoch}" if old else \
        f"{ACTIVE}{job_id}.{attempt}.{HELD_UNTIL}{epoch}"


def idle_flag(job_id: str, attempt: int, *, old: bool = False) -> str:
    return f"{LIMITS}{job_id}/{attempt}/{IDLE_FLAGGED}" if old else f"{ACTIVE}{job_id}.{attempt}.{IDLE_FLAGGED}"


def sweep_record(sweep_id: str) -> str:
    """A sweep's record (jobplane.sweeps.record), created create-only and updated by compare-and-swap."""
    return f"{SWEEPS}{sweep_id}/sweep.json"


def sweep_curve(sweep_id: str, job_id: str) -> str:
    """A trial's objective curve as read so far (jobplane.sweeps.curves), so a run reads only newer metric chunks."""
    return f"{SWEEPS}{sweep_id}/curves/{job_id}.json"


def active_sweep(sweep_id: str) -> str:
    """Exists while the sweep is RUNNING: one listing of active-sweeps/ gives the sweep reconcile its work."""
    return f"{ACTIVE_SWEEPS}{sweep_id}"


# ---- parsing -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Drop:
    """A key under queue/ (jobplane.model.drops reads the spec in it and says what is wrong with the key)."""

    key: str  # registry-relative
    job_id: str  # the file's stem
    owner: str  # the folder under queue/, or `default`
    ext: str
    folder: str | None  # what stands between queue/ and the file name, as written

    @property
    def name(self) -> str:
        return self.key.removeprefix(QUEUE)


class EventKey(NamedTuple):
    job_id: str
    stamp: str
    kind: str


class MarkerKey(NamedTuple):
    job_id: str
    state: State
    attempt: int
    limits: Limits | None = None  # a RUNNING marker's (None in one written before they rode in its name)


class HeartbeatKey(NamedTuple):
    job_id: str
    attempt: int
    rank: int
    mark: str  # "" for the heartbeat itself, "output" or "idle" for the marks beside it


class NodeKey(NamedTuple):
    """An object of one rank of one attempt: an exit report, or a file under logs/ or metrics/ (`name`)."""

    job_id: str
    attempt: int
    rank: int
    name: str = "exit.json"
    owner: str | None = None  # a file in a data folder: its owner's (None: jobs/<id>/, as JobData has it)


class AttemptKey(NamedTuple):
    job_id: str
    attempt: int


@dataclass(frozen=True)
class Limits:
    """A RUNNING attempt's per-job values, carried by its active marker's name (no GET needed), or by the limits/
    key written before."""

    job_id: str
    attempt: int
    nodes: int
    stall: int  # seconds
    cap: int  # seconds: min(job max_runtime, policy ceiling) when the job started
    facts: tuple[tuple[str, int], ...] = ()  # the check's rules' own numbers (none in a key written before them)

    @property
    def tail(self) -> str:
        """What the RUNNING marker's name carries after `RUNNING.<attempt>.`, and job.json's `limits`."""
        return limits_tail(self.nodes, self.stall, self.cap, self.facts)

    @property
    def key(self) -> str:
        """The limits/ key of limits written before they moved into the marker."""
        return limits_mark(self.job_id, self.attempt, self.nodes, self.stall, self.cap, self.facts)

    def fact(self, name: str) -> int | None:
        """A rule's number, if the key carries it."""
        return dict(self.facts).get(name)


@dataclass(frozen=True)
class Held:
    """A FAILED attempt whose VMs are kept until `until` (the spec's debug_hold), carried by a key name."""

    job_id: str
    attempt: int
    until: datetime
    old: bool = False  # written under limits/, before the held-until key moved under active/

    @property
    def key(self) -> str:
        return held_mark(self.job_id, self.attempt, self.until, old=self.old)


def _parser(pattern: str) -> Callable[[str], tuple[str, ...] | None]:
    """The groups of a key that is all of `pattern`, or None. Compiled on first use: a run parses a few kinds of
    key, and compiling every pattern was most of this module's import."""
    compiled: re.Pattern[str] | None = None

    def groups(key: str) -> tuple[str, ...] | None:
        nonlocal compiled
        if compiled is None:
            compiled = re.compile(pattern)
        found = compiled.fullmatch(key)
        return found.groups() if found else None

    return groups


_record = _parser(rf"{JOBS}{_ID}/job\.json")
_job_folder = _parser(rf"{JOBS}{_ID}/")
_event = _parser(rf"{JOBS}{_ID}/events/{_STAMP}-([^/]+)\.json")
_LIMITS_TAIL = rf"nodes-{_N}\.stall-{_N}\.cap-{_N}((?:\.{_FACT}-(?:0|[1-9][0-9]*))*)"
LIMITS_TAIL_PATTERN = rf"^{_LIMITS_TAIL}$"  # job.json's `limits`, as the marker's name carries them
_marker = _parser(rf"{ACTIVE}{_ID}/([A-Z_]+)\.{_N}(?:\.({_LIMITS_TAIL}))?")
_preempted = _parser(rf"{PREEMPTED}{_ID}")
_heartbeat = _parser(rf"{HEARTBEATS}{_ID}/{_N}/{_N}(?:\.(output|idle))?")
_limits = _parser(rf"{LIMITS}{_ID}/{_N}/{_LIMITS_TAIL}")
_idle_flag = _parser(rf"{ACTIVE}([^/.]+)\.{_N}\.{IDLE_FLAGGED}")
_old_idle_flag = _parser(rf"{LIMITS}{_ID}/{_N}/{IDLE_FLAGGED}")
_held = _parser(rf"{ACTIVE}([^/.]+)\.{_N}\.{HELD_UNTIL}{_N}")
_old_held = _parser(rf"{LIMITS}{_ID}/{_N}/{HELD_UNTIL}{_N}")
_exit = _parser(rf"{JOBS}{_ID}/attempts/{_N}/nodes/{_N}/exit\.json")
_boot_failure = _parser(rf"{JOBS}{_ID}/attempts/{_N}/boot-failure\.json")
_node_file = _parser(rf"(?:{JOBS}|{TEAMS}([^/]+)/){_ID}/(logs|metrics|system)/{_N}/{_N}/([^/]+)")
_cancel = _parser(rf"{CANCELS}([^/]+)/{_ID}")
_rejected_error = _parser(rf"{REJECTED}([^/.]+)\.error\.json")
_sweep_record = _parser(rf"{SWEEPS}{_ID}/sweep\.json")
_active_sweep = _parser(rf"{ACTIVE_SWEEPS}{_ID}")


def parse_drop(key: str) -> Drop | None:
    """The drop a queue/ key is, or None for anything else (not under queue/, a folder placeholder). A key
    with a bad extension or folder still parses: the launcher rejects it, naming the problem."""
    if not key.startswith(QUEUE):
        return None
    folder, _, name = key.removeprefix(QUEUE).rpartition("/")
    if not name:
        return None
    stem, dot, ext = name.rpartition(".")
    return Drop(key, stem if dot and stem else name, folder or DEFAULT_OWNER, ext.lower() if dot and stem else "",
                folder or None)


def parse_job_folder(folder: str) -> str | None:
    """The job of jobs/<id>/, a folder a delimiter listing of jobs/ hands back."""
    parts = _job_folder(folder)
    return parts[0] if parts else None


def parse_job_record(key: str) -> str | None:
    """The job of jobs/<id>/job.json."""
    parts = _record(key)
    return parts[0] if parts else None


def parse_event(key: str) -> EventKey | None:
    parts = _event(key)
    return EventKey(*parts) if parts else None


def parse_active_marker(key: str) -> MarkerKey | None:
    """A live job's marker; a RUNNING one's limits when its name carries them (only a RUNNING one's may)."""
    parts = _marker(key)
    if not parts or parts[1] not in State.__members__ or (parts[3] and parts[1] != State.RUNNING):
        return None
    job_id, attempt = parts[0], int(parts[2])
    return MarkerKey(job_id, State(parts[1]), attempt,
                     _limits_of(job_id, attempt, parts[4:8]) if parts[3] else None)


def _limits_of(job_id: str, attempt: int, parts: tuple[str, ...]) -> Limits:
    """Limits from the groups of `_LIMITS_TAIL`: nodes, stall, cap, then the facts."""
    facts = tuple((name, int(value)) for name, value in re.findall(rf"\.({_FACT})-([0-9]+)", parts[3]))
    return Limits(job_id, attempt, int(parts[0]), int(parts[1]), int(parts[2]), facts)


def parse_preempted_marker(key: str) -> str | None:
    parts = _preempted(key)
    return parts[0] if parts else None


def parse_heartbeat(key: str) -> HeartbeatKey | None:
    """A heartbeat, or its `.output` / `.idle` mark."""
    parts = _heartbeat(key)
    return HeartbeatKey(parts[0], int(parts[1]), int(parts[2]), parts[3] or "") if parts else None


def parse_limits(key: str) -> Limits | None:
    """A limits/<id>/<attempt>/nodes-... key (written before the limits moved into the RUNNING marker)."""
    parts = _limits(key)
    return _limits_of(parts[0], int(parts[1]), parts[2:]) if parts else None


def parse_idle_flag(key: str, *, old: bool = False) -> AttemptKey | None:
    """(job, attempt) of an active/<id>.<attempt>.idle-flagged key (old: limits/<id>/<attempt>/idle-flagged)."""
    parts = (_old_idle_flag if old else _idle_flag)(key)
    return AttemptKey(parts[0], int(parts[1])) if parts else None


def parse_held(key: str, *, old: bool = False) -> Held | None:
    """An active/<id>.<attempt>.held-until-<epoch s> key (old: limits/<id>/<attempt>/held-until-<epoch s>)."""
    parts = (_old_held if old else _held)(key)
    return Held(parts[0], int(parts[1]), datetime.fromtimestamp(int(parts[2]), UTC), old) if parts else None


def parse_exit_report(key: str) -> NodeKey | None:
    parts = _exit(key)
    return NodeKey(parts[0], int(parts[1]), int(parts[2])) if parts else None


def parse_boot_failure(key: str) -> AttemptKey | None:
    parts = _boot_failure(key)
    return AttemptKey(parts[0], int(parts[1])) if parts else None


def parse_node_file(key: str, area: str) -> NodeKey | None:
    """A file one rank wrote under <data folder>/<area>/<attempt>/<rank>/ (area: logs, metrics or system), in
    either layout (JobData)."""
    parts = _node_file(key)
    if not parts or parts[2] != area:
        return None
    return NodeKey(parts[1], int(parts[3]), int(parts[4]), parts[5], parts[0])


def parse_cancel_request(key: str) -> tuple[str, str] | None:
    """(owner, job) of cancels/<owner>/<id>."""
    parts = _cancel(key)
    return (parts[0], parts[1]) if parts else None


def parse_rejected_error(key: str) -> str | None:
    """The job of rejected/<id>.error.json."""
    parts = _rejected_error(key)
    return parts[0] if parts else None


def parse_sweep_record(key: str) -> str | None:
    """The sweep of sweeps/<id>/sweep.json."""
    parts = _sweep_record(key)
    return parts[0] if parts else None


def parse_active_sweep(key: str) -> str | None:
    """The sweep of an active-sweeps/<id> marker."""
    parts = _active_sweep(key)
    return parts[0] if parts else None


def job_named_by(key: str | None) -> str | None:
    """The job an object-created event is about: an exit report, a boot failure or a preempted-jobs/ marker."""
    if key is None:
        return None
    found = parse_exit_report(key) or parse_boot_failure(key)
    return found.job_id if found else parse_preempted_marker(key)
