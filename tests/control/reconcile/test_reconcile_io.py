"""Reading agents' facts: exit reports and boot failures, including bad ones and more than a check reads
(in-memory store)."""

from __future__ import annotations

import logging

from jobplane.clouds.memory import MemoryStore
from jobplane.control.facts import Attempt, read_attempt
from jobplane.decide.model import ExitReport
from jobplane.model import keys, records
from jobplane.store.registry import Registry


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_read_attempt_parses_reports_and_names_the_bad_field() -> None:
    reg = Registry(MemoryStore(), root="team")
    reg.put_json(keys.exit_report("j", 1, 0), records.ExitReport(code=0, instance_id="i-0").body())
    reg.put_json(keys.exit_report("j", 1, 3), records.ExitReport(
        code=1, instance_id="i-3", error="requirements.txt: could not install it").body())
    reg.put_json(keys.exit_report("j", 1, 4), {"code": None, "reason": "stopped", "instance_id": "i-4"})
    reg.put_json(keys.exit_report("j", 1, 1), {"code": "boom", "instance_id": "i-1"})
    reg.store.put(reg.key(keys.exit_report("j", 1, 2)), b"{not json")
    reg.put_json(keys.exit_report("j", 1, 5), {"code": 0})  # an agent that names no instance
    reg.put_json(keys.exit_report("j", 1, 6), {"version": 2, "code": 0, "instance_id": "i-6"})
    reg.put_json(keys.exit_report("j", 2, 0), {"code": 9})  # another attempt: not listed
    reg.store.put(reg.key(keys.ignored_flag("j", 1, keys.exit_report("j", 1, 2))), b"")
    logger, seen = logging.getLogger("jobplane.reconcile"), Lines()
    logger.addHandler(seen)
    try:
        got = read_attempt(reg, "j", 1, nodes=7)
    finally:
        logger.removeHandler(seen)
    assert got.exits == (ExitReport(0, 0, "exit", instance_id="i-0"),
                         ExitReport(3, 1, "exit", "requirements.txt: could not install it", instance_id="i-3"),
                         ExitReport(4, -1, "stopped", instance_id="i-4"))
    assert got.boot_failure is None
    assert {i.key.rsplit("/", 2)[1]: i.why for i in got.unreadable} == {
        "1": "exit report: field 'code': Input should be a valid integer, unable to parse string as an integer",
        "2": "exit report: not valid JSON: Invalid JSON: key must be a string at line 1 column 2",
        "5": "exit report: field 'instance_id': Field required",
        "6": "exit report: field 'version': Input should be 1",
    }
    assert got.noted == {keys.ignored_flag("j", 1, keys.exit_report("j", 1, 2))}
    assert "field 'code'" in "\n".join(seen.lines)


def test_read_attempt_finds_a_boot_failure() -> None:
    reg = Registry(MemoryStore())
    reg.put_json(keys.cluster("j", 1), {"hosts": []})
    reg.put_json(keys.boot_failure("j", 1), {"message": "python3 on this image is 3.9", "python": "3.9.2"})
    assert read_attempt(reg, "j", 1, nodes=1) == Attempt(boot_failure="python3 on this image is 3.9")
    reg.store.put(reg.key(keys.boot_failure("j", 2)), b"garbage")
    got = read_attempt(reg, "j", 2, nodes=1)
    assert got.boot_failure is None and [i.key for i in got.unreadable] == [keys.boot_failure("j", 2)]


def test_read_attempt_reads_one_bounded_fact_per_node_and_names_the_rest_once() -> None:
    store = MemoryStore()
    reg = Registry(store)
    reg.put_json(keys.exit_report("j", 1, 0), records.ExitReport(code=0, instance_id="i-0").body())
    reg.put(keys.exit_report("j", 1, 1), b'{"code": 0, "instance_id": "i-1"' + b" " * records.MAX_FACT_BYTES + b"}")
    for rank in (2, 3, 10, 11, 12):  # ranks past the attempt's 2 nodes
        reg.put_json(keys.exit_report("j", 1, rank), records.ExitReport(code=0, instance_id="i-x").body())
    reg.put(keys.boot_failure("j", 1), b'{"message": "' + b"x" * records.MAX_FACT_BYTES + b'"}')
    reg.put(keys.exits_prefix("j", 1) + "0/exit.json.bak", b"{}")
    reg.put(keys.attempt_prefix("j", 1) + "notes", b"{}")
    reg.put_json(keys.cluster("j", 1), {"hosts": []})
    store.calls.clear()
    got = read_attempt(reg, "j", 1, nodes=2)
    assert store.calls == {"list": 1, "get": 1}  # rank 0's report alone
    assert got.exits == (ExitReport(0, 0, "exit", instance_id="i-0"),) and got.boot_failure is None
    [excess] = got.unreadable
    assert excess.key == keys.attempt_prefix("j", 1) == "jobs/j/attempts/1/"
    assert excess.why == (
        "not read, now or later: 5 exit reports of ranks past the attempt's 2 nodes (ranks 2 to 12); "
        f"2 objects over the 64 KiB a check reads (boot-failure.json ({records.MAX_FACT_BYTES + 15} bytes), "
        f"nodes/1/exit.json ({records.MAX_FACT_BYTES + 33} bytes)); 2 keys no writer makes "
        "(jobs/j/attempts/1/nodes/0/exit.json.bak, jobs/j/attempts/1/notes)")
    assert keys.ignored_flag("j", 1, excess.key) == "jobs/j/attempts/1/ignored/excess"
