"""A day of the control plane in memory: MemoryStore and MemoryCompute on one Clock that moves only when a test
says ("12:31"), the real launcher and reconcilers called as their cron or event would call them, and the
agents' facts written as agents write them. Scenarios read as a timeline, run in milliseconds and see the
same times on every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from jobplane.agent.run import Outcome, hold_for
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore
from jobplane.control import launcher, reconcile, scheduled
from jobplane.deployment.context import Context
from jobplane.deployment.notify import Notify
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, records
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from jobplane.store.registry import Registry
from jobplane.sweeps import run as sweeps
from tests.helpers import publish_agent_manifest

MORNING = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@dataclass
class Day:
    clock: Clock
    store: MemoryStore
    compute: MemoryCompute
    reg: Registry
    metrics: CountingMetrics = field(default_factory=CountingMetrics)
    swept: list[sweeps.Outcome] = field(default_factory=list)  # what the last sweeper run did to sweeps
    notify: Notify | None = None  # what the runs publish through (the check's idle-GPU and budget notices)

    def at(self, hhmm: str) -> None:
        self.clock.at(hhmm)

    # ---- a user ------------------------------------------------------------------------------------
    def submit(self, job_id: str, spec: str = "", **fields: Any) -> launcher.Result:
        """Drop a spec in queue/ and run the launcher on its event; returns the launcher's outcome."""
        text = "run: python3 train.py\ninstance_type: t3.micro\n" + spec
        text += "".join(f"{k}: {v}\n" for k, v in fields.items())
        key = keys.queue_entry(job_id, keys.DEFAULT_OWNER, "yaml")
        self.store.put(self.reg.key(key), text.encode())
        return launcher.handle_drop(self.context(), key, now=self.clock()).result

    def drop(self, owner: str, job_id: str, instance_type: str = "t3.micro", spec: str = "") -> launcher.Result:
        """An owner's drop in queue/<owner>/ (`spec`: more of its lines) and the launcher's run on its event; returns
        the launcher's outcome."""
        key = keys.queue_entry(job_id, owner, "yaml")
        self.store.put(self.reg.key(key), f"run: python3 train.py\ninstance_type: {instance_type}\n{spec}".encode())
        return launcher.handle_drop(self.context(), key, now=self.clock()).result

    def ends(self, job_id: str, hhmm: str) -> list[str]:
        """At hhmm every job with VMs beats, this one exits 0 and its exit report's check runs (it ends SUCCEEDED):
        the jobs that check launched."""
        self.at(hhmm)
        before = len(self.compute.launches)
        for live in {inst.job_id for inst in self.compute.list_managed()}:
            self.beat(str(live))
        self.sweeper()
        self.exits(job_id, 0, 0)
        self.sweeper(jobs=[job_id])
        assert self.job(job_id).state == State.SUCCEEDED
        return [r.job_id for r in self.compute.launches[before:]]

    def started(self, job_id: str, spec: str = "", **fields: Any) -> JobRecord:
        """Submitted now; a minute later every rank beats and the check sees the job RUNNING."""
        assert self.submit(job_id, spec, **fields) == "launched"
        self.clock.advance(60)
        self.beat(job_id)
        self.sweeper()
        record = self.job(job_id)
        assert record.state == State.RUNNING, record
        return record

    # ---- the agents on the job's VMs -----------------------------------------------------------------
    def beat(self, job_id: str, *, output: bool = True, ranks: list[int] | None = None) -> None:
        """Every rank (or these) of the current attempt beats; rank 0's user process printed (output)."""
        record = self.job(job_id)
        for rank in ranks if ranks is not None else range(record.spec.num_nodes):
            self.reg.put_json(keys.heartbeat(job_id, record.attempt, rank), {"time": self.clock().isoformat()})
        if output:
            self.reg.put_json(keys.output_mark(job_id, record.attempt, 0), {"time": self.clock().isoformat()})

    def exits(self, job_id: str, rank: int, code: int, reason: str = "exit", **extra: Any) -> None:
        """The rank's agent writes its exit report and powers the VM off, unless (the agent's own rule) the spec's
        debug_hold keeps it up."""
        record = self.job(job_id)
        report = records.ExitReport(code=code, reason=reason, instance_id=record.instances[rank], **extra)
        self.reg.put_json(keys.exit_report(job_id, record.attempt, rank), report.body())
        if not hold_for(record.spec, Outcome(code, reason, stopped_by=report.stopped_by)):
            self.compute.reclaim(record.instances[rank])

    def preempted(self, job_id: str, rank: int = 0) -> None:
        """The cloud reclaims a Spot VM; its agent saw the notice, reported it and marked the job preempted."""
        record = self.job(job_id)
        iid = record.instances[rank]
        self.reg.put_json(keys.exit_report(job_id, record.attempt, rank),
                          records.ExitReport(code=143, reason="preempted", instance_id=iid,
                                             notice={"action": "terminate"}).body())
        self.reg.mark_preempted(job_id, records.PreemptedMarker(attempt=record.attempt, rank=rank,
                                                                instance_id=iid))
        self.compute.reclaim(iid)

    # ---- the functions, as their cron or event runs them ------------------------------------------
    def sweeper(self, **kwargs: Any) -> list[reconcile.Outcome]:
        """The sweeper function's invocation, the scheduled pass: the check, then the sweep reconcile (what it did
        to sweeps in `swept`), then the sweeps' early stops (with the check's outcomes)."""
        done = scheduled.run(self.context(), now=self.clock(), **kwargs)
        self.swept = done.swept
        return done.checked

    def rerun(self, **kwargs: Any) -> list[reconcile.Outcome]:
        return reconcile.rerun(self.context(), now=self.clock(), **kwargs)

    def uptime_cap(self, **kwargs: Any) -> list[reconcile.Outcome]:
        return reconcile.uptime_cap(self.context(), now=self.clock(), **kwargs)

    def backstop(self) -> list[launcher.Outcome]:
        return launcher.backstop(self.context(), now=self.clock(), min_age=0)

    def context(self) -> Context:
        """What the functions run with: this day's registry and cloud, the policy as it is now."""
        return Context(self.reg, self.compute, self.reg.policy(), self.metrics, self.notify)

    # ---- what a user and the cloud console show ----------------------------------------------------
    def job(self, job_id: str) -> JobRecord:
        return self.reg.job(job_id)

    def history(self, job_id: str) -> list[str]:
        """The job's transitions as "HH:MM STATE" (with the attempt from attempt 2 on), in the order they were
        written (a transition's event sorts after the one before it, even within one instant)."""
        return [f"{datetime.fromisoformat(e['time']):%H:%M} {e['to']}" + (f" {e['attempt']}" * (e["attempt"] > 1))
                for e in self.reg.events(job_id) if "to" in e and e["from"] != e["to"]]

    def vms(self, job_id: str) -> dict[int, list[str]]:
        """The states of every VM the job ever had, by attempt, in rank order."""
        out: dict[int, list[str]] = {}
        for inst in sorted(self.compute.instances(job_id=job_id), key=lambda i: (i.attempt or 0, i.rank or 0)):
            out.setdefault(inst.attempt or 0, []).append(inst.state)
        return out


def rules(outcomes: list[reconcile.Outcome]) -> list[tuple[str, str]]:
    """What a run did, rule by rule: (rule, result) of each outcome."""
    return [(o.action.rule, o.result) for o in outcomes]


def new_day(store: Callable[[Clock], MemoryStore] = MemoryStore) -> Day:
    """A day from MORNING on the manual clock, its store made by `store` (a MemoryStore that also records)."""
    clock = Clock(MORNING)
    memory = store(clock)
    reg = Registry(memory)
    publish_agent_manifest(reg, "aws")
    return Day(clock, memory, MemoryCompute(clock, boot=60, shutdown=60), reg)


@pytest.fixture
def day() -> Iterator[Day]:
    yield new_day()
