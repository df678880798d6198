"""Admission's cost at scale (issue 40): store calls per admission and per scheduled pass with N jobs waiting.

One owner with a quota of 4 runs 4 healthy jobs (beating); N more of its drops are refused and wait in its
admission record's queue. Measured, by store operation and by whether the key is an admission record's, on the
memory cloud through the real launcher and reconcilers (the calls are the ones S3 or GCS would get; a LIST here is
one call however many pages it would take):

- `admit`: a drop of another owner admitted into an empty quota (its claim, admission, launch, record);
- `refuse`: one more drop of the owner refused and queued behind N others;
- `check`: one check over the 4 healthy jobs and the N waiting (job.json GETs per healthy job stay 0);
- `backstop`: one launcher backstop run (its in-order admission's look at the records; no wait is due);
- `slot_freed`: a job's exit report and the check its event runs, which ends it and launches the next in line;
- `record_bytes`: the owner's admission record's size with N waiting;
- every run above with both owners under a budget (budgets.monthly_usd, none past its warning): a budget costs an
  admission and a check no call of its own;
- `check_later`: a check after that, every owner under its budget; `check_budget_due`: the same check once
  team-a's spend is past its budget (the notice's marker written, the notice sent); `check_budget_told`: the next
  (told already).

    .venv/bin/python bench/admission.py              # N = 100, 1000
    .venv/bin/python bench/admission.py --n 1000

Writes bench/results/admission.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import report  # noqa: E402

from jobplane.boot import agent_bundle  # noqa: E402
from jobplane.clouds.base import Notice  # noqa: E402
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore  # noqa: E402
from jobplane.control import launcher, reconcile  # noqa: E402
from jobplane.deployment.context import Context  # noqa: E402
from jobplane.deployment.notify import Notify  # noqa: E402
from jobplane.deployment.telemetry import CountingMetrics  # noqa: E402
from jobplane.model import images, keys, records  # noqa: E402
from jobplane.model.states import State  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SPEC = b"run: python3 train.py\ninstance_type: t3.micro\n"
QUOTA = 4


class Counting(MemoryStore):
    """A MemoryStore that counts each call by operation, apart for the admission records' keys."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.counted: Counter[str] = Counter()

    def _note(self, op: str, key: str) -> None:
        kind = " admission" if keys.ADMISSION in key else " job.json" if key.endswith("/job.json") else ""
        self.counted[op + kind] += 1

    def get(self, key: str) -> Any:
        self._note("GET", key)
        return super().get(key)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self._note("PUT", key)
        return super().put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Any = None) -> str:
        self._note("PUT", key)
        return super().put_if_absent(key, data, content_type, tags=tags)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        self._note("PUT", key)
        return super().put_if_match(key, data, version, content_type)

    def list(self, prefix: str, page_size: int = 1000) -> Any:
        self._note("LIST", prefix)
        return super().list(prefix, page_size)

    def delete(self, key: str) -> None:
        self._note("DELETE", key)
        super().delete(key)


def counted(store: Counting, run: Callable[[], Any]) -> dict[str, Any]:
    store.counted.clear()
    started = time.monotonic()
    run()
    calls = dict(sorted(store.counted.items()))
    return {"calls": calls, "total": sum(calls.values()),
            "admission": sum(v for k, v in calls.items() if k.endswith("admission")),
            "job_record_gets": calls.get("GET job.json", 0),
            "seconds": round(time.monotonic() - started, 3)}


class Topic:
    """The deployment's topic: what the runs publish."""

    def __init__(self) -> None:
        self.sent: list[Notice] = []

    def publish(self, notice: Notice) -> None:
        self.sent.append(notice)


def measure(n: int) -> dict[str, Any]:
    clock = Clock(START)
    store = Counting(clock)
    reg = Registry(store)
    compute = MemoryCompute(clock, boot=60, shutdown=60)
    variants = [agent_bundle.Variant("aws", python, arch, "0" * 64, 1)  # the manifest a deployment uploads
                for python in images.python_versions() for arch in images.ARCHITECTURES]
    reg.put(keys.agent_file(agent_bundle.MANIFEST), agent_bundle.manifest(variants))

    def policy(team_a: float) -> bytes:  # both owners have a budget (USD a month)
        budgets = f"budgets: {{monthly_usd: {{team-a: {team_a}, team-b: 1e6}}}}\n"
        return f"max_active_instances_per_owner: {QUOTA}\n{budgets}".encode()

    reg.put(keys.POLICY, policy(1e6))
    topic = Topic()
    sink = Notify(topic, CountingMetrics())

    def ctx() -> Context:
        return Context(reg, compute, reg.policy(), CountingMetrics(), sink)

    def drop(job_id: str, owner: str = "team-a") -> launcher.Outcome:
        key = keys.queue_entry(job_id, owner, "yaml")
        reg.put(key, SPEC)
        return launcher.handle_drop(ctx(), key, now=clock())

    running = [f"run-{i}" for i in range(QUOTA)]
    for job_id in running:
        assert drop(job_id).result == launcher.Result.LAUNCHED
    for i in range(n):
        assert drop(f"wait-{i:05d}").result == launcher.Result.WAITING
    clock.advance(60)
    for job_id in running:
        reg.put_json(keys.heartbeat(job_id, 1, 0), {"time": clock().isoformat()})
        reg.put_json(keys.output_mark(job_id, 1, 0), {"time": clock().isoformat()})
    reconcile.check(ctx(), now=clock())  # they start: RUNNING, their limits written
    clock.advance(60)
    for job_id in running:
        reg.put_json(keys.heartbeat(job_id, 1, 0), {"time": clock().isoformat()})

    out: dict[str, Any] = {"n": n, "quota": QUOTA}
    out["admit"] = counted(store, lambda: drop("other-team-job", owner="team-b"))
    out["refuse"] = counted(store, lambda: drop("one-more"))
    out["check"] = counted(store, lambda: reconcile.check(ctx(), now=clock()))
    out["backstop"] = counted(store, lambda: launcher.backstop(ctx(), now=clock(), min_age=3600))
    out["record_bytes"] = len(reg.get_bytes(keys.admission_owner("team-a")))

    record = reg.job("run-0")

    def slot_freed() -> None:
        reg.put_json(keys.exit_report("run-0", 1, 0), records.ExitReport(
            code=0, instance_id=record.instances[0]).body())
        reconcile.check(ctx(), now=clock(), jobs=["run-0"])

    out["slot_freed"] = counted(store, slot_freed)
    head = reg.job("wait-00000")
    assert reg.job("run-0").state == State.SUCCEEDED and head.state == State.LAUNCHING, head
    out["next_launched_after_s"] = (head.state_since - clock()) / timedelta(seconds=1)

    out["check_later"] = counted(store, lambda: reconcile.check(ctx(), now=clock()))  # the baseline of the two next
    reg.put(keys.POLICY, policy(0.001))  # team-a's running jobs have spent it now
    out["check_budget_due"] = counted(store, lambda: reconcile.check(ctx(), now=clock()))
    out["check_budget_told"] = counted(store, lambda: reconcile.check(ctx(), now=clock()))
    assert [n.data["event"] for n in topic.sent] == ["budget-exceeded"], topic.sent
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args(argv)
    results = []
    for n in args.n:
        results.append(measure(n))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return report.save("admission", {"bench": "admission", "measured_at": datetime.now(UTC).isoformat(),
                                     "results": results})


if __name__ == "__main__":
    raise SystemExit(main())
