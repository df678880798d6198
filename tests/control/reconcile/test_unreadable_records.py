"""One job.json that does not parse must not stop the check, the rerun, the uptime cap or the backstop for
every other job (F3), and a record written by a newer version (a field this one does not know, at any
level) is read, not refused: a rolling deploy runs two versions side by side."""

from __future__ import annotations

import json

from jobplane.decide.model import Rule
from jobplane.model import keys
from jobplane.model.states import State
from tests.control.reconcile.day import Day


def rewrite(day: Day, job_id: str, change: dict[str, object] | None = None,
            raw: bytes | None = None) -> None:
    """Someone (a newer version, a hand edit, a torn write) rewrote job.json."""
    key = day.reg.key(keys.job_record(job_id))
    if raw is None:
        body = json.loads(day.store.get(key).data)
        for path, value in (change or {}).items():
            *parents, last = path.split(".")
            node = body
            for name in parents:
                node = node[name]
            node[last] = value
        raw = json.dumps(body).encode()
    day.store.put(key, raw)


def test_a_record_from_a_newer_version_is_read_and_the_job_goes_on(day: Day) -> None:
    day.started("newer")  # 12:00 launched, 12:01 RUNNING
    rewrite(day, "newer", {"spec.gang_size": 5, "spec.stop_on": {"future": True}, "scheduler_hint": "x"})
    record = day.job("newer")
    assert record.state == State.RUNNING and record.spec.run == "python3 train.py"
    day.at("12:30")
    day.exits("newer", 0, 0)
    assert [(o.action.rule, o.result) for o in day.sweeper(jobs=["newer"])] == [(Rule.FINISHED, "applied")]
    assert day.job("newer").state == State.SUCCEEDED


def test_unparsable_records_leave_their_jobs_alone_and_every_other_job_goes_on(day: Day) -> None:
    day.started("good")
    day.started("torn")
    day.started("mangled")
    day.started("spotty", spot="true")
    day.at("12:30")
    for job_id in ("good", "torn", "mangled"):  # all three finish: the check must read their records
        day.exits(job_id, 0, 0)
    rewrite(day, "torn", raw=b'{"id": "torn", "spec": {"run"')
    rewrite(day, "mangled", {"state": "EXPLODED", "attempt": "one"})
    day.preempted("spotty")
    rewrite(day, "spotty", {"spec.num_nodes": "many"})

    for _ in range(2):  # every run: the bad ones are skipped, the good one is served
        day.sweeper()
        day.rerun()
        day.uptime_cap()
        day.backstop()
    assert day.job("good").state == State.SUCCEEDED
    assert day.reg.preempted().keys() == {"spotty"}, "its marker waits for a record that reads"
    for job_id in ("torn", "mangled"):
        noted = [e for e in day.reg.events(job_id) if e["kind"] == "unreadable-record"]
        assert len(noted) == 1 and "does not parse" not in noted[0]["problem"] and noted[0]["problem"], noted
        assert day.reg.get_bytes(keys.job_record(job_id)).startswith(b'{"id"'), "left as it was"
    assert day.metrics.totals["UnreadableRecords"] >= 2
