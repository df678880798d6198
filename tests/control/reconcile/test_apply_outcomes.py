"""The applier's outcomes as values, the metrics counted from them, and the events it leaves on a job
(an in-memory registry; no compute adapter, so a termination is an error the run reports and goes past)."""

from __future__ import annotations

from datetime import UTC, datetime

from jobplane.clouds.memory import MemoryStore
from jobplane.control import reconcile
from jobplane.control.reconcile import Result
from jobplane.decide.effects import RequestStop, Terminate, Transition
from jobplane.decide.model import Action, Rule
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
BLAST = "blast radius: 1 more terminations would exceed this run's limit of 0"


def registry() -> Registry:
    reg = Registry(MemoryStore())
    reg.create_job("j", parse_spec("instance_type: t3.micro\nrun: python3 train.py\n", "j"), NOW)
    return reg


def test_each_outcome_is_a_result_with_its_detail_and_its_metric() -> None:
    reg, metrics = registry(), CountingMetrics()
    actions = [
        Action(Rule.ORPHAN, "j", "orphan i-1", (Terminate(("i-1",)),)),
        Action(Rule.ORPHAN, "j", "orphan i-2", (Terminate(("i-2",)),)).refuse(BLAST),
        Action(Rule.STALLED, "j", "no output for 30m", (Transition(State.STALLED),), expect=frozenset({State.RUNNING}),
               expect_attempt=1),
        Action(Rule.ORPHAN, None, "orphan i-3: managed instance without a job id",
               (Terminate(("i-3",)),)).refuse(BLAST),
    ]

    outcomes = reconcile.apply(Context(reg, None, reg.policy(), metrics, dry_run=False), actions, now=NOW)

    assert [(o.result, o.detail) for o in outcomes] == [
        (Result.ERROR, "RuntimeError: no compute adapter to terminate with"),
        (Result.REFUSED, BLAST),
        (Result.SKIPPED, "job j: QUEUED -> STALLED refused: state is QUEUED, expected RUNNING"),
        (Result.REFUSED, BLAST),
    ]
    assert dict(metrics.totals) == {"ActionErrors": 1, "BlastRadiusRefusals": 2}
    assert reconcile.summary(outcomes)["actions"][0] == {
        "rule": "orphan", "job_id": "j", "result": "error", "reason": "orphan i-1",
        "detail": "RuntimeError: no compute adapter to terminate with"}
    refused = [e for e in reg.events("j") if e["kind"] == "refused"]
    assert [(e["rule"], e["reason"], e["refused"], e["instances"]) for e in refused] == [
        ("orphan", "orphan i-2", BLAST, ["i-2"])]


def test_dry_run_is_reported_and_leaves_the_job_and_its_history_alone() -> None:
    reg, metrics = registry(), CountingMetrics()
    before = reg.events("j")
    stop = Action(Rule.STOP, "j", "uptime cap 1h in 10m: stop requested", (RequestStop(),))

    (outcome,) = reconcile.apply(Context(reg, None, reg.policy(), metrics, dry_run=True), [stop], now=NOW)

    assert (outcome.result, outcome.detail) == (Result.DRY_RUN, None)
    assert reg.events("j") == before and dict(metrics.totals) == {}


def test_a_stop_request_is_written_and_recorded_on_the_job() -> None:
    reg = registry()
    stop = Action(Rule.STOP_PEERS, "j", "rank 0 stopped early: asking rank 1 to stop", (RequestStop(by="sweeper"),))

    (outcome,) = reconcile.apply(Context(reg, None, reg.policy(), CountingMetrics(), dry_run=False), [stop], now=NOW)

    assert outcome.result == Result.APPLIED
    (event,) = [e for e in reg.events("j") if e["kind"] == "stop-requested"]
    assert (event["by"], event["rule"], event["time"]) == ("sweeper", "stop-peers", NOW.isoformat())


def test_a_refused_mass_termination_writes_a_bounded_history() -> None:
    reg, metrics = Registry(MemoryStore()), CountingMetrics()
    jobs = [f"j{n:02d}" for n in range(reconcile.REFUSAL_EVENTS + 5)]
    for job_id in jobs:
        reg.create_job(job_id, parse_spec("instance_type: t3.micro\nrun: python3 train.py\n", job_id), NOW)
    actions = [Action(Rule.ORPHAN, job_id, f"orphan i-{job_id}", (Terminate((f"i-{job_id}",)),)).refuse(BLAST)
               for job_id in jobs]

    outcomes = reconcile.apply(Context(reg, None, reg.policy(), metrics, dry_run=False), actions, now=NOW)

    assert [o.result for o in outcomes] == [Result.REFUSED] * len(jobs)
    assert metrics.totals["BlastRadiusRefusals"] == len(jobs), "every refusal is counted"
    recorded = [job_id for job_id in jobs if any(e["kind"] == "refused" for e in reg.events(job_id))]
    assert recorded == jobs[:reconcile.REFUSAL_EVENTS]
