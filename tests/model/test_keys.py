"""keys.py builds and parses every key: build -> parse round-trips for each kind, and each parser refuses
every other kind of key (property tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobplane.model import keys
from jobplane.model.states import State

job_ids = st.from_regex(keys.JOB_ID_PATTERN, fullmatch=True)
counts = st.integers(min_value=0, max_value=10**6)
stamps = st.builds(keys.stamp, st.datetimes(min_value=datetime(2000, 1, 1), timezones=st.just(UTC)),
                   st.from_regex(r"[0-9a-f]{4}", fullmatch=True))
kinds = st.from_regex(r"[a-z]+(-[a-z]+)*", fullmatch=True)
owners = st.just(keys.DEFAULT_OWNER) | st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)


@dataclass(frozen=True)
class Kind:
    """One kind of key: its parts, how they build a key, and what parsing that key must give back."""

    parts: st.SearchStrategy[tuple[Any, ...]]
    build: Callable[..., str]
    parse: Callable[[str], Any]
    parsed: Callable[..., Any]
    unparse: Callable[[Any], str]  # the key that parsed as this

    @staticmethod
    def of(parts: st.SearchStrategy[tuple[Any, ...]], build: Callable[..., str], parse: Callable[[str], Any],
           parsed: Callable[..., Any], unparse: Callable[[Any], str] | None = None) -> Kind:
        return Kind(parts, build, parse, parsed, unparse or (lambda p: build(p) if isinstance(p, str) else build(*p)))


def node_file(area: str) -> Callable[[keys.NodeKey], str]:
    return lambda n: keys.node_prefix(area, keys.JobData(n.job_id, n.owner), n.attempt, n.rank) + n.name


def in_area(area: str) -> Callable[[str], keys.NodeKey | None]:
    return lambda key: keys.parse_node_file(key, area)


def beat_of(mark: str) -> Callable[..., keys.HeartbeatKey]:
    return lambda j, a, r: keys.HeartbeatKey(j, a, r, mark)


def chunk(ext: str) -> Callable[..., keys.NodeKey]:
    return lambda d, a, r, seq: keys.NodeKey(d.job_id, a, r, f"{seq:08d}.{ext}", d.owner)


def drop(job_id: str, owner: str, ext: str) -> keys.Drop:
    folder = None if owner == keys.DEFAULT_OWNER else owner
    return keys.Drop(keys.queue_entry(job_id, owner, ext), job_id, owner, ext, folder)


def same(job_id: str) -> str:
    return job_id


ONE, NODE, ATTEMPT = st.tuples(job_ids), st.tuples(job_ids, counts, counts), st.tuples(job_ids, counts)
FACTS = st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9]{0,15}", fullmatch=True).filter(
    lambda n: n not in ("nodes", "stall", "cap")), counts), max_size=keys.LIMITS_FACTS,
    unique_by=lambda f: f[0]).map(tuple)
LIMITS = st.tuples(counts, counts, counts, FACTS)
EPOCHS = st.integers(min_value=0, max_value=2**33).map(lambda s: datetime.fromtimestamp(s, UTC))
HELD = st.tuples(job_ids, counts, EPOCHS)


def running_marker(job_id: str, attempt: int, limits: tuple[Any, ...]) -> str:
    """A RUNNING marker whose name carries its attempt's limits."""
    return keys.active_marker(job_id, State.RUNNING, attempt, keys.limits_tail(*limits))


def running_parsed(job_id: str, attempt: int, limits: tuple[Any, ...]) -> keys.MarkerKey:
    return keys.MarkerKey(job_id, State.RUNNING, attempt, keys.Limits(job_id, attempt, *limits))


def old(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A builder or parser of the key as written under limits/ before it moved under active/."""
    return lambda *parts: fn(*parts, old=True)


def held(job_id: str, attempt: int, until: datetime) -> keys.Held:
    return keys.Held(job_id, attempt, until)


def held_old(job_id: str, attempt: int, until: datetime) -> keys.Held:
    return keys.Held(job_id, attempt, until, old=True)
# a job's data: in its owner's teams/<owner>/<id>/, or in jobs/<id>/ (a job recorded before)
datas = st.builds(keys.JobData, job_ids, st.none() | st.from_regex(keys.LABEL_KEY, fullmatch=True))
CHUNK = st.tuples(datas, counts, counts, counts)
KINDS = {
    "job record": Kind.of(ONE, keys.job_record, keys.parse_job_record, same),
    "event": Kind.of(st.tuples(job_ids, stamps, kinds), keys.event, keys.parse_event, keys.EventKey),
    "active marker": Kind.of(st.tuples(job_ids, st.sampled_from(State), counts), keys.active_marker,
                             keys.parse_active_marker, keys.MarkerKey,  # a RUNNING one's limits too, if it has some
                             lambda m: keys.active_marker(*m[:3], m.limits.tail if m.limits else None)),
    "preempted marker": Kind.of(ONE, keys.preempted_marker, keys.parse_preempted_marker, same),
    "heartbeat": Kind.of(NODE, keys.heartbeat, keys.parse_heartbeat, beat_of(""), lambda p: keys.heartbeat(*p)),
    "output mark": Kind.of(NODE, keys.output_mark, keys.parse_heartbeat, beat_of("output"),
                           lambda p: keys.heartbeat(*p)),
    "idle mark": Kind.of(NODE, keys.idle_mark, keys.parse_heartbeat, beat_of("idle"), lambda p: keys.heartbeat(*p)),
    "running marker": Kind.of(st.tuples(job_ids, counts, LIMITS), running_marker, keys.parse_active_marker,
                              running_parsed, lambda m: keys.active_marker(*m[:3], m.limits.tail)),
    "limits": Kind.of(st.tuples(job_ids, counts, counts, counts, counts), keys.limits_mark, keys.parse_limits,
                      keys.Limits, lambda p: p.key),
    "idle flag": Kind.of(ATTEMPT, keys.idle_flag, keys.parse_idle_flag, keys.AttemptKey),
    "old idle flag": Kind.of(ATTEMPT, old(keys.idle_flag), old(keys.parse_idle_flag), keys.AttemptKey,
                             lambda p: keys.idle_flag(*p, old=True)),
    "held": Kind.of(HELD, keys.held_mark, keys.parse_held, held, lambda h: h.key),
    "old held": Kind.of(HELD, old(keys.held_mark), old(keys.parse_held), held_old, lambda h: h.key),
    "exit report": Kind.of(NODE, keys.exit_report, keys.parse_exit_report, keys.NodeKey,
                           lambda p: keys.exit_report(*p[:3])),
    "boot failure": Kind.of(ATTEMPT, keys.boot_failure, keys.parse_boot_failure, keys.AttemptKey),
    "log chunk": Kind.of(CHUNK, keys.log_chunk, in_area("logs"), chunk("log"), node_file("logs")),
    "console log": Kind.of(st.tuples(datas, counts, counts), keys.console_log, in_area("logs"),
                           lambda d, a, r: keys.NodeKey(d.job_id, a, r, "console.log", d.owner), node_file("logs")),
    "metrics chunk": Kind.of(CHUNK, keys.metrics_chunk, in_area("metrics"), chunk("jsonl"), node_file("metrics")),
    "system chunk": Kind.of(CHUNK, keys.system_chunk, in_area("system"), chunk("jsonl"), node_file("system")),
    "cancel request": Kind.of(st.tuples(st.from_regex(keys.LABEL_KEY, fullmatch=True), job_ids), keys.cancel_request,
                              keys.parse_cancel_request, lambda o, j: (o, j), lambda p: keys.cancel_request(*p)),
    "rejected error": Kind.of(ONE, keys.rejected_error, keys.parse_rejected_error, same),
    "drop": Kind.of(st.tuples(job_ids, owners, st.sampled_from(["yaml", "yml", "json"])), keys.queue_entry,
                    keys.parse_drop, drop, lambda d: d.key),
}
# Kinds one parser reads together: the heartbeat parser reads the marks beside it, the logs parser the console.
SIBLINGS = [{"heartbeat", "output mark", "idle mark"}, {"log chunk", "console log"},
            {"active marker", "running marker"}]


def related(a: str, b: str) -> bool:
    return a == b or any({a, b} <= group for group in SIBLINGS)


@settings(deadline=None)  # a loaded machine (make test's workers) slows an example past the 200 ms default
@given(data=st.data())
def test_every_key_parses_back_to_its_parts_and_as_no_other_kind(data: st.DataObject) -> None:
    built = {name: (parts, kind.build(*parts)) for name, kind in KINDS.items()
             for parts in [data.draw(kind.parts, label=name)]}
    for name, kind in KINDS.items():
        for other, (parts, key) in built.items():
            if other == name:
                assert kind.parse(key) == kind.parsed(*parts), f"{name} {key} did not round-trip"
            elif not related(name, other):
                assert kind.parse(key) is None, f"the {name} parser took a {other} key: {key}"


# Key-like text: the segments of every kind of key, right and slightly wrong, in any order.
SEGMENTS = ["queue", "jobs", "teams", "cancels", "team-a", "active", "heartbeats", "limits", "preempted-jobs",
            "rejected", "attempts", "nodes",
            "RUNNING.1.nodes-1.stall-2.cap-3", "RUNNING.1.nodes-1.stall-2.cap-3.budget-5", "j.1.idle-flagged",
            "j.1.held-until-5", "held-until-5",
            "logs", "metrics", "events", "j", "0", "1", "01", "x", "RUNNING.1", "RUNNING.01", "NOPE.1", "0.idle",
            "0.output", "0.x", "job.json", "exit.json", "boot-failure.json", "idle-flagged", "nodes-1.stall-2.cap-3",
            "nodes-1.stall-2", "00000001.log", "j.error.json", "20261122T050421.123456Z-ab12-created.json", ""]
key_like = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=7).map("/".join)


@settings(deadline=None)
@given(key=key_like | st.text(max_size=60))
def test_what_a_parser_accepts_builds_back_to_the_same_key(key: str) -> None:
    """Parsers are exact: a key they accept is the key its parts build (no leading zeros, no extra parts)."""
    for name, kind in KINDS.items():
        parsed = kind.parse(key)
        assert parsed is None or kind.unparse(parsed) == key, f"the {name} parser took {key!r} as {parsed}"


@pytest.mark.parametrize("key", [
    "active/j/RUNNING.01", "active/j/RUNNINGX.1", "active/j/RUNNING.1/x", "heartbeats/j/1/0.other",
    "active/j/RUNNING.1.nodes-1.stall-2", "active/j/LAUNCHING.1.nodes-1.stall-2.cap-3", "active/j.1.idle",
    "active/j/1.idle-flagged", "active/j.01.held-until-5", "active/j.1.held-until-05",
    "heartbeats/j/x/0", "limits/j/1/nodes-1.stall-2", "jobs/j/attempts/x/boot-failure.json",
    "jobs/j/attempts/1/nodes/0/other.json", "jobs/j/events/yesterday-created.json", "preempted-jobs/",
    "preempted-jobs/a/b", "rejected/j.yaml", "jobs/j/job.json/x",
])
def test_near_misses_are_not_keys(key: str) -> None:
    assert all(kind.parse(key) is None for kind in KINDS.values()), key


def test_drops_parse_into_job_id_owner_and_extension() -> None:
    upper = "queue/team-a/x-1.YML"
    assert keys.parse_drop(upper) == keys.Drop(upper, "x-1", "team-a", "yml", "team-a")
    assert keys.parse_drop("queue/x-1") == keys.Drop("queue/x-1", "x-1", "default", "", None)  # rejected: no extension
    assert keys.parse_drop("queue/team-a/") is None and keys.parse_drop("jobs/x/job.json") is None


@pytest.mark.parametrize(("key", "job"), [
    (keys.exit_report("train", 2, 1), "train"),
    (keys.preempted_marker("spotty"), "spotty"),
    (keys.boot_failure("train", 3), "train"),
    ("jobs/train/attempts/x/boot-failure.json", None),
    (keys.heartbeat("train", 1, 0), None),
    (keys.job_record("train"), None),
    ("jobs/train/attempts/1/nodes/0/other.json", None),
    (None, None),
])
def test_job_named_by(key: str | None, job: str | None) -> None:
    assert keys.job_named_by(key) == job


def test_a_held_mark_never_ends_a_hold_before_its_time() -> None:
    """The check reads a debug_hold's end from the mark's name alone: whole seconds, rounded up (truncated, a VM held
    until 11:57:57.589 was terminated at 11:57:57.520, and its usage ended before the hold it bills)."""
    until = datetime(2026, 11, 27, 11, 57, 57, 589529, tzinfo=UTC)
    for was in (False, True):
        mark = keys.parse_held(keys.held_mark("j", 1, until, old=was), old=was)
        assert mark is not None and until <= mark.until < until + timedelta(seconds=1)


def test_running_markers_carry_their_limits_and_one_written_before_still_parses() -> None:
    """The limits ride in a RUNNING marker's name; a marker written before them is still a live RUNNING job (its
    limits None: the check reads them elsewhere), and only a RUNNING marker may carry them."""
    assert keys.parse_active_marker("active/j/RUNNING.3.nodes-2.stall-60.cap-3600.budget-5") == keys.MarkerKey(
        "j", State.RUNNING, 3, keys.Limits("j", 3, 2, 60, 3600, (("budget", 5),)))
    assert keys.parse_active_marker("active/j/RUNNING.3") == keys.MarkerKey("j", State.RUNNING, 3, None)
    assert keys.parse_active_marker("active/j/PREEMPTED.3.nodes-2.stall-60.cap-3600") is None
    assert keys.held_mark("j", 2, datetime(2026, 1, 1, tzinfo=UTC)) == "active/j.2.held-until-1767225600"
    assert keys.idle_flag("j", 2) == "active/j.2.idle-flagged" and keys.parse_active_marker("active/j.2.idle-flagged") \
        is None


def test_stamps_after_one_event_at_one_instant_sort_after_it_and_differ() -> None:
    """Two writers racing from one record at one `now` (a day on the manual clock; one event delivered twice) each
    stamp their event after the record's. The stamps must differ: with one random hex digit of difference, two of
    test_day's five overlapping reruns (in a quiet make test) each took the record for their own write and launched
    attempt 2 twice."""
    from jobplane.model.history import LastEvent, stamp_after

    now = datetime(2026, 11, 27, 12, 40, tzinfo=UTC)
    previous = LastEvent(stamp=keys.stamp(now, "ffff"), kind="transition", body={})  # every new one sorts before it
    after = [stamp_after(previous, now) for _ in range(200)]
    assert all(s > previous.stamp for s in after)
    assert len(set(after)) >= 195, "racing writers would share a stamp"


@given(job=job_ids, other=job_ids, owner=st.from_regex(keys.LABEL_KEY, fullmatch=True), root=st.sampled_from(["", "r"]))
def test_a_jobs_own_keys_are_its_record_folder_heartbeats_and_data_folder_of_any_owner(job: str, other: str,
                                                                                        owner: str, root: str) -> None:
    base = keys.root_prefix(root)
    for data in (keys.JobData(job, owner), keys.JobData(job)):
        for key in (keys.log_chunk(data, 1, 0, 0), keys.checkpoints_prefix(data) + "x", keys.job_record(job),
                    keys.heartbeat(job, 1, 0)):
            assert keys.of_job(base + key, root, job)
            assert not keys.of_job(base + key, root, other) or other == job
    assert not keys.of_job(base + keys.preempted_marker(job), root, job)  # an object, not under a prefix of its
    assert not keys.of_job(base + keys.team_folder(owner) + job, root, job)  # no folder, not its data
