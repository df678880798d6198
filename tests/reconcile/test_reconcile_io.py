"""Reading agents' facts: event keys and exit reports, including bad ones (in-memory store, no cloud)."""

from __future__ import annotations

import logging

import pytest

from jobplane import keys
from jobplane.clouds.memory import MemoryStore
from jobplane.decide.model import ExitReport
from jobplane.reconcile import job_named_by, read_exits
from jobplane.registry import Registry


@pytest.mark.parametrize(("key", "job"), [
    (keys.exit_report("train", 2, 1), "train"),
    (keys.preempted_marker("spotty"), "spotty"),
    (keys.heartbeat("train", 1, 0), None),
    (keys.job_record("train"), None),
    ("jobs/train/attempts/1/nodes/0/other.json", None),
    (None, None),
])
def test_job_named_by(key: str | None, job: str | None) -> None:
    assert job_named_by(key) == job


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_read_exits_parses_reports_and_names_the_bad_field() -> None:
    reg = Registry(MemoryStore(), root="team")
    reg.put_json(keys.exit_report("j", 1, 0), {"code": 0, "reason": "exit"})
    reg.put_json(keys.exit_report("j", 1, 1), {"code": "boom"})
    reg.store.put(reg.key(keys.exit_report("j", 1, 2)), b"{not json")
    reg.put_json(keys.exit_report("j", 2, 0), {"code": 9})  # another attempt: not listed
    logger, seen = logging.getLogger("jobplane.reconcile"), Lines()
    logger.addHandler(seen)
    try:
        reports = read_exits(reg, "j", 1)
    finally:
        logger.removeHandler(seen)
    assert reports == (ExitReport(0, 0, "exit"), ExitReport(1, -1, "exit"))
    text = "\n".join(seen.lines)
    assert "field 'code' is 'boom'" in text and "unreadable exit report" in text
