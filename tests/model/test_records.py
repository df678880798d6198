"""The records agents and functions exchange: round trips, old bodies, and errors that name the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from jobplane.model import records

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
EXAMPLES: list[records.Record] = [
    records.ExitReport(code=0, instance_id="i-1", started_at=AT, ended_at=AT),
    records.ExitReport(code=143, reason="preempted", instance_id="i-1", notice={"action": "terminate", "time": "t"}),
    records.ExitReport(code=None, reason="stopped", instance_id="i-1", stopped_by="idle-gpu", stop_reason="idle"),
    records.PreemptedMarker(attempt=2, rank=1, instance_id="i-2", notice={"action": "terminate"}),
    records.PreemptedMarker(attempt=2, by="sweeper"),
    records.StopRequest(time=AT, by="cli", reason="cancel"),
    records.ClusterFile(job_id="j", attempt=1, hosts=["10.0.0.1", "10.0.0.2"], instances=["i-1", "i-2"],
                        master_addr="10.0.0.1", num_nodes=2, idle_gpu=records.IdleWatch(window=1800, threshold=5)),
    records.Heartbeat(time=AT, instance_id="i-1", rank=0, attempt=1, phase="running", gpu_util=41.5, step=12),
    records.OutputMark(time=AT, step=12),
    records.IdleMark(time=AT, mean_gpu_util=0.5, window=1800, threshold=5),
    records.BootFailure(message="no bundle for python 3.9", python="3.9.2", host="vm", time=1.5),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_what_a_writer_writes_its_reader_reads_back(record: records.Record) -> None:
    written = json.dumps(record.body()).encode()
    assert json.loads(written)["version"] == records.VERSION
    assert type(record).parse(written) == record


def test_a_body_written_before_versions_reads_as_version_1_and_unknown_fields_are_ignored() -> None:
    old = {"code": 0, "reason": "exit", "instance_id": "i-1", "started_at": "2026-11-22T12:00:00+00:00",
           "something_newer": [1, 2]}
    report = records.ExitReport.parse(json.dumps(old))
    assert report.version == 1 and report.code == 0 and report.started_at == AT


@pytest.mark.parametrize(("model", "body", "message"), [
    (records.ExitReport, b"{not json", "exit report: not valid JSON"),
    (records.ExitReport, b"[1, 2]", "exit report: Input should be an object"),
    (records.ExitReport, {"code": 0}, "exit report: field 'instance_id': Field required"),
    (records.ExitReport, {"code": "boom", "instance_id": "i-1"}, "exit report: field 'code': Input should be a valid "
                                                                  "integer"),
    (records.ExitReport, {"code": 0, "instance_id": "i-1", "reason": "crashed"}, "field 'reason': Input should be "
                                                                                 "'exit', 'preempted', 'stopped'"),
    (records.ExitReport, {"version": 2, "code": 0, "instance_id": "i-1"}, "field 'version': Input should be 1"),
    (records.PreemptedMarker, {"rank": 0}, "preempted marker: field 'attempt': Field required"),
    (records.PreemptedMarker, {"attempt": 1, "by": "someone"}, "field 'by': Input should be 'agent' or 'sweeper'"),
    (records.StopRequest, {"time": "yesterday", "by": "cli"}, "stop request: field 'time': Input should be a valid "
                                                              "datetime"),
    (records.StopRequest, {"time": "2026-11-22T12:00:00Z", "by": "someone"}, "stop request: field 'by': Input should "
                                                                            "be 'cli', 'uptime-cap'"),
    (records.ClusterFile, {"job_id": "j", "attempt": 1, "hosts": [], "master_addr": "x", "num_nodes": 1},
     "cluster.json: field 'hosts': List should have at least 1 item"),
    (records.ClusterFile, {"job_id": "j", "attempt": 1, "hosts": ["x"], "master_addr": "x", "num_nodes": 1,
                           "idle_gpu": {"window": 60, "threshold": 120}},
     "cluster.json: field 'idle_gpu.threshold': Input should be less than or equal to 100"),
    (records.BootFailure, {"python": "3.9"}, "boot failure: field 'message': Field required"),
    (records.ClusterFile, {}, "cluster.json: field 'job_id': Field required (and 4 more)"),
])
def test_a_record_that_does_not_parse_says_which_and_which_field(model: type[records.Record], body: object,
                                                                 message: str) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(records.RecordError) as caught:
        model.parse(data)
    assert message in str(caught.value)


@pytest.mark.parametrize("by", ["cli", "uptime-cap", "idle-gpu", "sweeper", "debug-hold", "sweep", "unknown"])
def test_every_stop_requests_by_ever_written_still_reads(by: str) -> None:
    request = records.StopRequest.parse(json.dumps({"time": "2026-11-22T12:00:00Z", "by": by}).encode())
    assert request.by == by and isinstance(request.by, records.StopBy)
