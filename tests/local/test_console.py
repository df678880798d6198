"""The local cloud's console: one short line per event for people, the functions' logs and metrics to a file."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from jobplane.clouds.aws_local import LocalAws
from jobplane.clouds.memory import MemoryStore
from jobplane.clouds.pubsub import PubSubError, PubSubNotifier
from jobplane.clouds.sns import SnsNotifier
from jobplane.control.launcher import Outcome, Result, summary
from jobplane.decide.budget import Budget
from jobplane.local.console import Console, ConsoleHandler, action_line, launcher_outcomes, notified_line
from jobplane.local.ec2_runner import spot_warning, state_change
from jobplane.local.pubsub_topic import PubSubTopic
from jobplane.local.triggers import LambdaFunctions, scheduled
from jobplane.model.jobrecord import JobRecord
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import JobNotFound, Registry
from jobplane.views.notices import budget, ended

T = datetime(2026, 11, 22, 11, 30, 5, tzinfo=UTC).timestamp()


def action(rule: str, job_id: str | None, result: str = "applied", reason: str = "why",
           detail: str | None = None) -> dict[str, Any]:
    return {"rule": rule, "job_id": job_id, "result": result, "detail": detail, "reason": reason}


def test_actions_become_lines_people_read() -> None:
    assert action_line(action("stalled", "j1", reason="no new output for 2m")) == \
        "stalled     j1: no new output for 2m"
    assert action_line(action("rerun", "j1", reason="preempted; rerun as attempt 2")) == \
        "rerun       j1: preempted; rerun as attempt 2"
    assert action_line(action("timed-out", "j1", reason="uptime cap 1m reached")).startswith("capped ")
    assert action_line(action("orphan", None, reason="orphan i-1: job x is not live")) == \
        "reaped      orphan i-1: job x is not live"
    assert action_line(action("orphan", "j1", result="refused", reason="orphan i-1")) == \
        "refused     j1: orphan: orphan i-1 (safety limit)"
    assert action_line(action("finished", "j1", result="error", detail="OSError: boom")) == \
        "error       j1: finished: OSError: boom"
    for quiet in ("limits", "repair", "cleanup", "clear", "remark"):
        assert action_line(action(quiet, "j1")) is None, quiet
    assert action_line(action("stalled", "j1", result="skipped", detail="another run acted")) is None
    assert action_line(action("stalled", "j1", result="dry-run")) is None


def test_launcher_answers_name_their_jobs() -> None:
    def answer(*outcomes: Outcome) -> Any:
        return json.loads(json.dumps(summary(outcomes)))  # as the function returned (or logged) it

    assert launcher_outcomes(answer(Outcome("queue/demo-1.yaml", Result.LAUNCHED, "launched 1 x t3.micro"))) == \
        [("demo-1", "launched")]
    assert launcher_outcomes(answer(Outcome("queue/a.yml", Result.REJECTED, "run: required"),
                                    Outcome("b", Result.WAITING))) == [("a", "rejected"), ("b", "waiting")]
    assert launcher_outcomes(None) == [] and launcher_outcomes(answer()) == []
    assert launcher_outcomes(answer(Outcome("queue/team-a/demo-2.yaml", Result.LAUNCHED))) == [("demo-2", "launched")]


def test_notifications_the_topic_delivers_are_one_line_each(reg: Registry) -> None:
    reg.create_job("demo-1", parse_spec("instance_type: t3.micro\nrun: x\n", "demo-1"))
    done = reg.transition("demo-1", State.CANCELLED, reason="cancelled by the user before it started")
    with mock_aws():
        aws = LocalAws("us-east-1")
        topic, inbox = aws.notification_inbox()
        SnsNotifier(topic, aws.sns).publish(ended(done, done.updated_at))
        (data,) = aws.notifications(inbox)
        assert aws.notifications(inbox) == []
    assert notified_line(data) == "notified    demo-1 CANCELLED: cancelled by the user before it started " \
                                  "(never launched)"
    ran = {"job_id": "j3", "state": "SUCCEEDED", "reason": "every rank exited 0", "runtime_s": 20, "cost_usd": 0.00017}
    assert notified_line(ran) == "notified    j3 SUCCEEDED: every rank exited 0 (ran 20s, ~$0.000170 estimated)"
    idle = {"event": "idle-gpu", "job_id": "j2", "reason": "GPU utilization under 5% on every rank for 30m"}
    assert notified_line(idle) == "notified    j2 has idle GPUs: GPU utilization under 5% on every rank for 30m"


def test_a_budget_notice_reads_well_through_the_topic_and_on_the_console() -> None:
    """Issue 59: a budget notice printed `notified None None (never launched)` (it has no job), and amounts under
    a cent showed as $0.00."""
    over = Budget("team-a", 0.052, 0.05, 80, "wait", "2026-11")
    notice = budget("team-a", "exceeded", over.figures, warn_at=80, on_exceeded="wait", month="2026-11",
                    then=over.then, spent=over.spent, limit=over.budget)
    with mock_aws():
        aws = LocalAws("us-east-1")
        topic, inbox = aws.notification_inbox()
        SnsNotifier(topic, aws.sns).publish(notice)
        (data,) = aws.notifications(inbox)
    assert notified_line(data) == "notified    team-a has spent its budget: $0.0520 of $0.0500 this month (104%); " \
                                  "new jobs wait until 2026-12; jobs that ran go on"
    assert (data["spent_usd"], data["budget_usd"], data["event"]) == (0.052, 0.05, "budget-exceeded")
    with PubSubTopic("projects/p/topics/jobs") as pubsub:
        PubSubNotifier("projects/p/topics/jobs", emulator=pubsub.address).publish(notice)
        (pulled,) = pubsub.pull()
    assert notified_line(pulled) == notified_line(data), "Pub/Sub carries the same message"
    warned = Budget("team-b", 8.5, 10, 80, "refuse", "2026-11")
    data = budget("team-b", "warning", warned.figures, warn_at=80, on_exceeded="refuse", month="2026-11").data
    assert notified_line(data) == "notified    team-b has spent 80% of its budget: $8.50 of $10.00 this month (85%); " \
                                  "at 100% its new jobs are refused"


def test_the_local_gcp_topic_receives_what_the_functions_publish_and_refuses_what_pubsub_would(
        reg: Registry) -> None:
    reg.create_job("demo-2", parse_spec("instance_type: e2-small\nrun: x\n", "demo-2"))
    done = reg.transition("demo-2", State.CANCELLED, reason="cancelled by the user before it started")
    with PubSubTopic("projects/p/topics/jobs") as topic:
        PubSubNotifier("projects/p/topics/jobs", emulator=topic.address).publish(ended(done, done.updated_at))
        (data,) = topic.pull()
        assert topic.pull() == []
        with pytest.raises(PubSubError, match="HTTP 404"):
            PubSubNotifier("projects/p/topics/other", emulator=topic.address).publish(ended(done, done.updated_at))
        refused = PubSubNotifier("projects/p/topics/jobs", emulator=topic.address).session.post(
            f"http://{topic.address}/v1/projects/p/topics/jobs:publish", json={"messages": [{}]}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert topic.pull() == []
    assert notified_line(data) == "notified    demo-2 CANCELLED: cancelled by the user before it started " \
                                  "(never launched)"


@pytest.fixture
def reg() -> Registry:
    return Registry(MemoryStore())


def record(reg: Registry, job_id: str) -> JobRecord | None:
    try:
        return reg.job(job_id)
    except JobNotFound:
        return None


def test_console_tells_a_jobs_story_with_its_instances(reg: Registry) -> None:
    reg.create_job("demo-1", parse_spec("instance_type: t3.micro\nnum_nodes: 2\nrun: x\n", job_id="demo-1"))
    reg.transition("demo-1", State.LAUNCHING, attempt=1, instances=["i-a", "i-b"], instance_type="t3.micro",
                   zone="us-east-1a")
    lines: list[str] = []
    console = Console(lambda j: record(reg, j), lines.append, clock=lambda: T)
    console.invoked("launcher", {}, summary([Outcome("queue/demo-1.yaml", Result.LAUNCHED)]))
    console.ec2(**_event(state_change("i-b", "running")))
    console.ec2(**_event(spot_warning("i-a")))
    console.invoked("sweeper", {}, {"actions": [action("lost-spot", "demo-1", reason="Spot capacity lost"),
                                                action("limits", "demo-1")]})
    console.ec2(**_event(state_change("i-a", "terminated")))
    console.ec2(**_event(state_change("i-z", "pending")))  # not worth a line
    console.invoked("launcher", {}, summary([Outcome("queue/other.yaml", Result.EXISTS)]))  # nor this
    stamp = datetime.fromtimestamp(T).strftime("%H:%M:%S")
    assert lines == [f"{stamp}  {text}" for text in (
        "launched    demo-1 attempt 1: 2 x t3.micro in us-east-1a (i-a, i-b)",
        "booted      i-b (demo-1 rank 1)",
        "preempted   i-a (demo-1 rank 0): Spot interruption warning (terminate)",
        "preempted   demo-1: Spot capacity lost",
        "terminated  i-a (demo-1 rank 0)",
    )]


def test_a_rejected_drop_says_why(reg: Registry) -> None:
    reg.create_job("bad", parse_spec("instance_type: t3.micro\nrun: x\n", job_id="bad"))
    reg.transition("bad", State.INVALID, reason="instance_type: 't3.micro' is not allowed")
    lines: list[str] = []
    Console(lambda j: record(reg, j), lines.append).invoked(
        "launcher", {}, summary([Outcome("queue/bad.yaml", Result.INVALID, "instance_type: not allowed")]))
    assert lines[0].endswith("rejected    bad: instance_type: 't3.micro' is not allowed")


def test_warnings_and_failures_are_one_line_with_details_in_the_file(reg: Registry) -> None:
    lines: list[str] = []
    logger = logging.getLogger("local-cloud.test-console")
    handler = ConsoleHandler(Console(lambda j: None, lines.append))
    logger.addHandler(handler)
    try:
        logger.info("details only in the file")
        logger.error("function launcher failed on Scheduled Event: KeyError: 'x'\nTraceback (most recent call last)")
        logger.warning("function metering is not there yet")
    finally:
        logger.removeHandler(handler)
    assert [line.split("  ", 1)[1] for line in lines] == [
        "error       function launcher failed on Scheduled Event: KeyError: 'x' (details in functions.log)",
        "warning     function metering is not there yet",
    ]


def _event(detail: dict[str, Any]) -> dict[str, Any]:
    return {"detail_type": detail["detail-type"], "detail": detail["detail"]}


@pytest.fixture
def jobplane_log_streams() -> Iterator[None]:
    """Functions points the "jobplane" logger's handlers at its stream: put them back for the next tests."""
    import functions.aws.common  # noqa: F401  (makes Powertools' handler now, so it is restored too)

    handlers = [h for h in logging.getLogger("jobplane").handlers if type(h) is logging.StreamHandler]
    streams = [h.stream for h in handlers]
    yield
    for handler, stream in zip(handlers, streams, strict=True):
        handler.setStream(stream)


@pytest.mark.usefixtures("jobplane_log_streams")
def test_functions_write_their_logs_and_metrics_to_the_log_stream_not_the_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("JOBPLANE_BUCKET", "console-test")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "jobplane")
    stream = io.StringIO()
    results: list[tuple[str, Any]] = []
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="console-test")
        functions = LambdaFunctions("console-test", "us-east-1", stream,
                                    on_result=lambda name, event, result: results.append((name, result)))
        functions.invoke("sweeper", scheduled("sweeper", "us-east-1"))
    out = capsys.readouterr()
    assert '"_aws"' not in out.out + out.err, "an EMF metric line reached the terminal"
    written = stream.getvalue()
    assert '"_aws"' in written and '"CheckDuration"' in written, written[:500]
    assert results == [("sweeper", {"actions": []})]
