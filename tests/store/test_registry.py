"""Registry: create-only records, the state table, CAS transitions, events and markers."""

from __future__ import annotations

import json
import tomllib
from datetime import UTC, datetime, timedelta
from itertools import product
from pathlib import Path

import pytest

from jobplane.clouds.memory import MemoryStore
from jobplane.decide.rules import LaunchCause, Rule
from jobplane.model import history, keys, records
from jobplane.model.jobrecord import JobRecord, Updates
from jobplane.model.spec import parse_spec
from jobplane.model.states import LIVE, TERMINAL, TRANSITIONS, State
from jobplane.store.registry import JobExists, JobNotFound, Registry, TransitionRefused, UnknownField
from tests.helpers import Crash, crash_on_event_writes, race

ROOT = Path(__file__).resolve().parents[2]
SPEC = parse_spec("run: python3 train.py\ninstance_type: g5.xlarge\nowner: ml\n")

# The table as docs/architecture.md states it, plus the edges the reconcilers need (documented in states.py).
DOCUMENTED_EDGES = {
    (State.QUEUED, State.LAUNCHING), (State.LAUNCHING, State.RUNNING), (State.RUNNING, State.SUCCEEDED),
    (State.RUNNING, State.FAILED), (State.RUNNING, State.PREEMPTED), (State.PREEMPTED, State.LAUNCHING),
    (State.QUEUED, State.WAITING_CAPACITY), (State.PREEMPTED, State.WAITING_CAPACITY),
    (State.WAITING_CAPACITY, State.LAUNCHING), (State.QUEUED, State.INVALID), (State.RUNNING, State.LAUNCHING),
}


def registry() -> Registry:
    return Registry(MemoryStore(), root="team-a")


def put_in_state(reg: Registry, job_id: str, state: State) -> None:
    """Write a record directly in `state` (test setup only; production code always transitions)."""
    reg.create_job(job_id, SPEC)
    record, version = reg.get(job_id)
    forced = record.model_copy(update={"state": state, "attempt": 1})
    reg.store.put_if_match(reg.key(keys.job_record(job_id)), forced.model_dump_json().encode(), version)
    reg.repair_markers(job_id)


def test_design_edges_and_live_to_end_edges_are_in_the_table() -> None:
    assert DOCUMENTED_EDGES <= TRANSITIONS
    for live in LIVE:
        for end in (State.CANCELLED, State.TIMED_OUT, State.STALLED):
            assert (live, end) in TRANSITIONS
    assert not any(src in TERMINAL for src, _ in TRANSITIONS), "terminal states are final"


@pytest.mark.parametrize(("src", "dst"), list(product(State, State)))
def test_state_table(src: State, dst: State) -> None:
    reg = registry()
    put_in_state(reg, "job", src)
    if (src, dst) in TRANSITIONS:
        record = reg.transition("job", dst, reason="test")
        assert record.state == dst and reg.job("job").state == dst
        markers = reg.active().get("job", [])
        assert [m.state for m in markers] == ([dst] if dst in LIVE else [])
        assert reg.events("job")[-1]["to"] == dst
    else:
        with pytest.raises(TransitionRefused):
            reg.transition("job", dst)
        assert reg.job("job").state == src


def test_create_is_create_only() -> None:
    reg = registry()
    first = reg.create_job("job-1", SPEC)
    with pytest.raises(JobExists, match="already exists"):
        reg.create_job("job-1", parse_spec("run: other\ninstance_type: t3.micro\n"))
    assert reg.job("job-1") == first
    assert first.spec.id == "job-1" and first.owner == "ml"
    assert reg.store.get("team-a/jobs/job-1/job.json")  # the root prefix is applied


def test_missing_job() -> None:
    with pytest.raises(JobNotFound):
        registry().get("nope")


def test_lifecycle_events_and_markers() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    assert [(m.state, m.attempt) for m in reg.active()["j"]] == [(State.QUEUED, 0)]
    reg.transition("j", State.LAUNCHING, attempt=1, instances=["i-1"])
    reg.transition("j", State.RUNNING)
    reg.transition("j", State.PREEMPTED, reason="spot")
    reg.mark_preempted("j", records.PreemptedMarker(attempt=1, instance_id="i-1"))
    assert set(reg.preempted()) == {"j"}
    reg.transition("j", State.LAUNCHING, expect=[State.PREEMPTED], attempt=2, restarts=1)
    reg.clear_preempted("j")
    assert [(m.state, m.attempt) for m in reg.active()["j"]] == [(State.LAUNCHING, 2)]
    reg.transition("j", State.RUNNING)
    reg.transition("j", State.SUCCEEDED, exit_code=0)
    assert reg.active() == {} and reg.preempted() == {}
    kinds = [e["kind"] for e in reg.events("j")]
    assert kinds == ["created", "launching", "running", "preempted", "launching", "running", "succeeded"]
    assert reg.job("j").restarts == 1 and reg.job("j").exit_code == 0


def test_expectations_refuse_a_lost_race() -> None:
    reg = registry()
    put_in_state(reg, "j", State.PREEMPTED)
    reg.transition("j", State.LAUNCHING, expect=[State.PREEMPTED], expect_attempt=1, attempt=2)
    with pytest.raises(TransitionRefused, match="expected PREEMPTED"):
        reg.transition("j", State.LAUNCHING, expect=[State.PREEMPTED], attempt=2)
    with pytest.raises(TransitionRefused, match="attempt is 2, expected 1"):
        reg.transition("j", State.LAUNCHING, expect_attempt=1, attempt=3)


def test_concurrent_claims_have_one_winner() -> None:
    reg = registry()
    put_in_state(reg, "j", State.PREEMPTED)
    wins = race(8, lambda _: reg.transition("j", State.LAUNCHING, expect=[State.PREEMPTED], attempt=2),
                TransitionRefused)
    assert len(wins) == 1
    assert [e["kind"] for e in reg.events("j")].count("launching") == 1


def test_repair_markers_after_a_crash_between_writes() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    reg.store.put(reg.key(keys.active_marker("j", "RUNNING", 7)), b"")  # stale leftover
    assert len(reg.active()["j"]) == 2
    reg.repair_markers("j")
    assert [(m.state, m.attempt) for m in reg.active()["j"]] == [(State.QUEUED, 0)]


def test_heartbeats_by_listing_only() -> None:
    reg = registry()
    reg.put_json(keys.heartbeat("a", 1, 0), {"t": 1})
    reg.put_json(keys.output_mark("a", 1, 0), {})
    reg.put_json(keys.heartbeat("b", 2, 1), {})
    reg.put_json("heartbeats/garbage", {})
    store = reg.store
    assert isinstance(store, MemoryStore)
    gets = store.calls.get("get", 0)
    beats = reg.heartbeats()
    assert store.calls.get("get", 0) == gets, "listing heartbeats must not GET"
    assert {(b.job_id, b.attempt, b.rank, b.output) for b in beats} == {
        ("a", 1, 0, False), ("a", 1, 0, True), ("b", 2, 1, False)}


def test_an_update_naming_no_field_is_refused_and_changes_nothing() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    before = reg.get("j")
    with pytest.raises(UnknownField, match=r"'lauched_at' \(did you mean 'launched_at'\?\)"):
        reg.transition("j", State.LAUNCHING, lauched_at=datetime.now(UTC))
    with pytest.raises(UnknownField, match="'no_such_thing'"):
        reg.update("j", no_such_thing=1)
    assert reg.get("j") == before
    assert [e["kind"] for e in reg.events("j")] == ["created"]


def test_updates_names_only_fields_of_the_record_a_write_may_set() -> None:
    kept = {"id", "spec", "state", "owner", "created_at", "updated_at", "reason", "cause", "last_event", "layout"}
    assert set(Updates.__annotations__) == set(JobRecord.model_fields) - kept


def test_mypy_refuses_a_field_a_write_may_not_set_before_anything_runs() -> None:
    """make typecheck checks tests/typing_refusals.py, whose bad writes carry the ignores of mypy's refusals: if
    mypy stopped refusing one, its ignore would be unused, which --strict reports."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "tests.typing_refusals" in config["modules"] and config["strict"] is True
    assert (ROOT / "tests" / "typing_refusals.py").read_text().count("# type: ignore[") == 3


def test_a_record_with_fields_this_version_does_not_know_still_reads() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    record, version = reg.get("j")
    body = {**record.model_dump(mode="json"), "field_from_a_newer_version": {"x": 1}}
    reg.store.put_if_match(reg.key(keys.job_record("j")), json.dumps(body).encode(), version)
    assert reg.job("j") == record
    assert reg.transition("j", State.LAUNCHING, attempt=1).attempt == 1


def test_a_record_written_before_retries_were_counted_reads_with_none_used() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    record, version = reg.get("j")
    body = record.model_dump(mode="json", exclude={"retries"})
    reg.store.put_if_match(reg.key(keys.job_record("j")), json.dumps(body).encode(), version)
    assert reg.job("j").retries == 0
    assert reg.transition("j", State.LAUNCHING, attempt=1, retries=1).retries == 1, "a known field: not refused"


def test_a_transition_records_its_cause_beside_the_reason_on_the_record_and_its_event() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    reg.transition("j", State.LAUNCHING, attempt=1, reason="launching attempt 1", cause=LaunchCause.SUBMITTED)
    record = reg.transition("j", State.RUNNING, reason="every rank has sent a heartbeat", cause=Rule.STARTED)
    assert (record.cause, reg.job("j").cause) == ("started", "started")
    assert [(e["kind"], e.get("cause")) for e in reg.events("j")] == [
        ("created", None), ("launching", "submitted"), ("running", "started")]
    assert reg.transition("j", State.CANCELLED, reason="cancelled by the user").cause is None, "each transition's own"
    assert "cause" not in reg.events("j")[-1]


def test_a_record_written_before_causes_were_recorded_reads_with_none() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    reg.transition("j", State.LAUNCHING, attempt=1, cause=LaunchCause.SUBMITTED)
    record, version = reg.get("j")
    body = record.model_dump(mode="json", exclude={"cause"})
    reg.store.put_if_match(reg.key(keys.job_record("j")), json.dumps(body).encode(), version)
    assert reg.job("j").cause is None
    body = {**body, "cause": "a-cause-from-a-newer-version"}
    reg.store.put_if_match(reg.key(keys.job_record("j")), json.dumps(body).encode(), reg.get("j")[1])
    assert reg.job("j").cause == "a-cause-from-a-newer-version", "read as it is, never unreadable"


def test_a_crash_between_the_cas_and_the_event_loses_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    with monkeypatch.context() as crashing:
        refused = crash_on_event_writes(reg, crashing, "launching")
        with pytest.raises(Crash):
            reg.transition("j", State.LAUNCHING, attempt=1, instances=["i-1"], event=history.Retried(retries=0))
    assert refused and reg.job("j").state == State.LAUNCHING
    assert [e["kind"] for e in reg.events("j")] == ["created"], "the crash lost the event object"
    assert reg.job("j").last_event is not None and reg.job("j").last_event.kind == "launching"
    reg.transition("j", State.RUNNING)  # the next writer completes the history
    events = reg.events("j")
    assert [e["kind"] for e in events] == ["created", "launching", "running"]
    assert events[1] | {"time": None} == {"time": None, "kind": "launching", "from": "QUEUED", "to": "LAUNCHING",
                                          "attempt": 1, "reason": None, "retries": 0}


def test_a_crash_after_the_last_transition_is_completed_by_whoever_reads_the_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    reg.transition("j", State.LAUNCHING, attempt=1)
    with monkeypatch.context() as crashing:
        crash_on_event_writes(reg, crashing, "cancelled")
        with pytest.raises(Crash):
            reg.transition("j", State.CANCELLED, reason="user")
    assert [m.state for m in reg.active()["j"]] == [State.LAUNCHING], "the crash left the old marker too"
    reg.repair_markers("j")  # what the check does for a job whose markers disagree with its record
    reg.repair_markers("j")
    assert [e["kind"] for e in reg.events("j")] == ["created", "launching", "cancelled"]
    assert reg.active() == {}


def test_a_crash_after_the_create_keeps_the_created_event(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry()
    with monkeypatch.context() as crashing:
        crash_on_event_writes(reg, crashing, "created")
        with pytest.raises(Crash):
            reg.create_job("j", SPEC)
    reg.transition("j", State.LAUNCHING, attempt=1)
    events = reg.events("j")
    assert [e["kind"] for e in events] == ["created", "launching"]
    assert events[0]["spec"]["instance_type"] == "g5.xlarge"


def test_each_event_is_written_once_however_often_the_history_is_completed() -> None:
    reg = registry()
    reg.create_job("j", SPEC)
    for _ in range(3):
        reg.complete_history(reg.job("j"))
    reg.transition("j", State.LAUNCHING, attempt=1)
    reg.complete_history(reg.job("j"))
    assert [e["kind"] for e in reg.events("j")] == ["created", "launching"]


def test_the_history_lists_in_write_order_even_when_writes_share_one_now() -> None:
    reg = registry()
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    for n in range(8):  # stamps of one `now` differ only in a random token: eight jobs would catch a random order
        job = f"j{n}"
        reg.create_job(job, SPEC, now=now)
        reg.transition(job, State.LAUNCHING, now=now)  # the launcher's claim, then its launch, in one run
        reg.transition(job, State.LAUNCHING, now=now, attempt=1)
        reg.transition(job, State.RUNNING, now=now - timedelta(seconds=1))  # a writer whose clock is behind
        steps = [(e["kind"], e.get("attempt")) for e in reg.events(job)]
        assert steps == [("created", None), ("launching", 0), ("launching", 1), ("running", 1)], job


def test_a_poller_reads_each_event_and_metrics_chunk_once_and_what_is_new() -> None:
    """Events and metrics chunks are create-only: a long-lived reader (the dashboard polling a job's page) reads
    each from the bucket once, then only the new ones; the listing still says what exists. The cache is bounded."""
    from jobplane.ops import jobs
    from jobplane.store import rooted

    class Counting(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.reads: list[str] = []

        def get(self, key: str):  # type: ignore[no-untyped-def]
            self.reads.append(key)
            return super().get(key)

    store = Counting()
    reg = Registry(store, root="team-a")
    reg.create_job("j1", SPEC)
    reg.record_event("j1", history.IdleGpu(attempt=1, reason="idle", action="warn", threshold=5, window=3))
    point = '{{"time": "2026-11-27T10:00:0{0}+00:00", "metric": "loss", "value": {1}, "step": {0}}}\n'
    data = reg.job("j1").data
    reg.put(keys.metrics_chunk(data, 1, 0, 0), point.format(1, 2.0).encode())
    first = (reg.events("j1"), jobs.read_metrics(reg, data))
    store.reads.clear()
    assert len(first[0]) == 2 and len(first[1]) == 1  # created, idle-gpu; one point
    assert (reg.events("j1"), jobs.read_metrics(reg, data)) == first
    assert store.reads == []  # nothing read again
    reg.put(keys.metrics_chunk(data, 1, 0, 1), point.format(2, 1.0).encode())
    assert [s.value for s in jobs.read_metrics(reg, data)] == [2.0, 1.0]
    assert store.reads == ["team-a/" + keys.metrics_chunk(data, 1, 0, 1)]  # only the new chunk
    big = b"x" * (rooted.CREATED_CACHE_BYTES // 8)
    for n in range(9):  # 9/8 of the bound: the oldest goes
        reg.put(f"blob/{n}", big)
        reg.get_created(f"blob/{n}")
    store.reads.clear()
    reg.get_created("blob/8")
    reg.get_created("blob/0")
    assert store.reads == ["team-a/blob/0"]
