"""Reading agents' facts: exit reports and boot failures, including bad ones (in-memory store)."""

from __future__ import annotations

import logging

from jobplane import keys
from jobplane.clouds.memory import MemoryStore
from jobplane.decide.model import ExitReport
from jobplane.reconcile import read_attempt
from jobplane.registry import Registry


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_read_attempt_parses_reports_and_names_the_bad_field() -> None:
    reg = Registry(MemoryStore(), root="team")
    reg.put_json(keys.exit_report("j", 1, 0), {"code": 0, "reason": "exit"})
    reg.put_json(keys.exit_report("j", 1, 3), {"code": 1, "error": "requirements.txt: could not install it"})
    reg.put_json(keys.exit_report("j", 1, 1), {"code": "boom"})
    reg.store.put(reg.key(keys.exit_report("j", 1, 2)), b"{not json")
    reg.put_json(keys.exit_report("j", 2, 0), {"code": 9})  # another attempt: not listed
    logger, seen = logging.getLogger("jobplane.reconcile"), Lines()
    logger.addHandler(seen)
    try:
        reports, failure = read_attempt(reg, "j", 1)
    finally:
        logger.removeHandler(seen)
    assert reports == (ExitReport(0, 0, "exit"), ExitReport(1, -1, "exit"),
                       ExitReport(3, 1, "exit", "requirements.txt: could not install it"))
    assert failure is None
    text = "\n".join(seen.lines)
    assert "field 'code' is 'boom'" in text and "unreadable exit report" in text


def test_read_attempt_finds_a_boot_failure() -> None:
    reg = Registry(MemoryStore())
    reg.put_json(keys.cluster("j", 1), {"hosts": []})
    reg.put_json(keys.boot_failure("j", 1), {"message": "python3 on this image is 3.9", "python": "3.9.2"})
    assert read_attempt(reg, "j", 1) == ((), "python3 on this image is 3.9")
    reg.store.put(reg.key(keys.boot_failure("j", 2)), b"garbage")
    assert read_attempt(reg, "j", 2)[1] == "the VM's bootstrap reported a failure it could not describe"
