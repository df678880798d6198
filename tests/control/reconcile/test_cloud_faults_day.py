"""A chaos day of the cloud's faults on the manual clock: the real launcher and reconcilers over MemoryStore and
MemoryCompute behind jobplane.clouds.memory_faults, every call kind of theirs (the store's reads, writes and
conditional writes; the cloud's launch, listing, terminate and console) failing with the service's
throttle or server error, some writes landing with their answer lost, multi-node launches refused for capacity,
and new instances missing from listings for up to 30 s.

Over SEEDS days, each must end as the fault-free day does (every job's state and restarts), with no attempt's
rank launched twice, no VM terminated under an attempt its job still runs, no record or drop lost, no VM left;
and over them all, each fault path is met at least once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from jobplane.clouds.base import Instance, LaunchRequest, StoreError
from jobplane.clouds.faults import ApiFailed, Faults
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore
from jobplane.clouds.memory_faults import FaultyCompute, FaultyStore
from jobplane.control import launcher, reconcile, scheduled
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, records
from jobplane.model.states import State
from jobplane.ops import cancels, jobs
from jobplane.store import rooted
from jobplane.store.registry import JobNotFound, Registry
from tests.control.reconcile.day import MORNING
from tests.helpers import publish_agent_manifest

SEEDS = range(10)
STORE_RATE, CLOUD_RATE = 0.05, 0.2  # of the calls, after the SDK's retries: harsher than any cloud, to meet each path
FAULTY_MINUTES, DAY_MINUTES = 120, 200  # faults stop at 14:00; by 15:20 every job has ended


@dataclass(frozen=True)
class Job:
    id: str
    submit_at: int  # minute of the day
    minutes: int  # of training before rank 0 exits
    nodes: int = 1
    code: int = 0
    spot: bool = False
    preempt_at: int | None = None  # minutes into attempt 1 the cloud reclaims rank 0
    cancel_at: int | None = None  # minute of the day the user cancels


JOBS = (Job("one", 0, 20), Job("pair", 2, 25, nodes=2), Job("spot", 4, 30, spot=True, preempt_at=10),
        Job("spot-pair", 6, 20, nodes=2, spot=True, preempt_at=8), Job("fails", 8, 10, code=1),
        Job("cancelled", 10, 500, cancel_at=40), Job("late", 60, 15, nodes=2))


class Watched:
    """The deployment's Compute, noting each terminate of a live VM whose attempt its job still runs (a wrongful
    one: only a job's end, a preemption, a cancel or an orphan ends a VM here)."""

    def __init__(self, inner: FaultyCompute, vms: MemoryCompute, truth: Registry) -> None:
        self.inner, self.vms, self.truth = inner, vms, truth
        self.cloud, self.region = inner.cloud, inner.region
        self.wrongful: list[str] = []

    def launch(self, request: LaunchRequest) -> list[Instance]:
        return self.inner.launch(request)

    def list_managed(self) -> list[Instance]:
        return self.inner.list_managed()

    def console_output(self, instance_id: str) -> str:
        return self.inner.console_output(instance_id)

    def terminate(self, instance_ids: list[str]) -> None:
        live = {i.id: i for i in self.vms.instances(managed=True, live=True)}
        for iid in instance_ids:
            if (inst := live.get(iid)) is not None and inst.job_id is not None:
                record = self.truth.job(inst.job_id)
                if record.state in (State.LAUNCHING, State.RUNNING) and record.attempt == inst.attempt:
                    self.wrongful.append(f"{iid} of {inst.job_id} attempt {inst.attempt} while {record.state}")
        self.inner.terminate(instance_ids)


class CloudDay:
    def __init__(self, seed: int, store_rate: float, cloud_rate: float) -> None:
        self.clock = Clock(MORNING)
        self.memory = MemoryStore(self.clock)
        self.cloud = MemoryCompute(self.clock, boot=60, shutdown=60)
        self.store_faults, self.cloud_faults = Faults(store_rate, seed), Faults(cloud_rate, seed)
        self.truth = Registry(self.memory)  # what the agents and the test read and write: no faults of theirs
        publish_agent_manifest(self.truth, "aws")
        self.reg = Registry(FaultyStore(self.memory, self.store_faults))
        self.faulty = FaultyCompute(self.cloud, self.cloud_faults, self.clock)
        self.compute = Watched(self.faulty, self.cloud, self.truth)
        self.metrics = CountingMetrics()
        self.failed_runs: Counter[str] = Counter()
        self.started: dict[str, float] = {}  # instance id -> minute its training started

    @property
    def minute(self) -> int:
        return int((self.clock() - MORNING).total_seconds() // 60)

    def ctx(self) -> Context:
        return Context(self.reg, self.compute, self.reg.policy(), self.metrics)

    def run(self, name: str, fn: Callable[[], object]) -> None:
        """A function's invocation: one that failed on a fault is logged; its event's retry or the cron catches up."""
        try:
            fn()
        except (ApiFailed, StoreError):
            self.failed_runs[name] += 1

    # ---- the users, the agents and the cloud --------------------------------------------------------------
    def users(self) -> None:
        for job in JOBS:
            if self.minute == job.submit_at:
                key = keys.queue_entry(job.id, keys.DEFAULT_OWNER, "yaml")
                self.truth.put(key, (f"run: python3 train.py\ninstance_type: t3.micro\nnum_nodes: {job.nodes}\n"
                                     f"spot: {str(job.spot).lower()}\nmax_restarts: 3\n").encode(), "application/yaml")
                self.run("launcher", partial(self.on_drop, key))
            if self.minute == job.cancel_at:
                for _ in range(30):  # the user tries again until it worked
                    try:
                        cancels.cancel(self.reg, job.id, compute=lambda: self.compute)
                        break
                    except (ApiFailed, StoreError):
                        continue
                    except jobs.JobError as exc:
                        assert "already CANCELLED" in str(exc), exc  # an earlier try landed; its answer was lost
                        break

    def on_drop(self, key: str) -> object:
        return launcher.handle_drop(self.ctx(), key, now=self.clock())

    def agents(self) -> None:
        by_id = {job.id: job for job in JOBS}
        for inst in self.cloud.instances(managed=True, live=True):
            assert inst.job_id is not None and inst.attempt is not None and inst.rank is not None
            if inst.state != "running" or not self.truth.has(keys.cluster(inst.job_id, inst.attempt)):
                continue  # booting, or the agent waits for its cluster.json
            job, started = by_id[inst.job_id], self.started.setdefault(inst.id, self.minute)
            ran = self.minute - started
            if self.truth.has(keys.stop_request(inst.job_id)):
                self.exit(inst, 143, "stopped")
            elif job.preempt_at is not None and inst.attempt == 1 and inst.rank == 0 and ran >= job.preempt_at:
                self.exit(inst, 143, "preempted", notice={"action": "terminate"})
                self.truth.mark_preempted(inst.job_id, records.PreemptedMarker(attempt=1, rank=0, instance_id=inst.id))
            elif ran >= job.minutes:
                self.exit(inst, job.code if inst.rank == 0 else 0, "exit")
            else:
                self.truth.put_json(keys.heartbeat(inst.job_id, inst.attempt, inst.rank),
                                    {"time": self.clock().isoformat()})
                self.truth.put_json(keys.output_mark(inst.job_id, inst.attempt, inst.rank),
                                    {"time": self.clock().isoformat()})

    def exit(self, inst: Instance, code: int, reason: str, **extra: Any) -> None:
        assert inst.job_id is not None and inst.attempt is not None and inst.rank is not None
        report = records.ExitReport(code=code, reason=reason, instance_id=inst.id, **extra)
        self.truth.put_json(keys.exit_report(inst.job_id, inst.attempt, inst.rank), report.body())
        self.cloud.reclaim(inst.id)  # the agent powers off, or the cloud took its Spot capacity back
        job_id = inst.job_id
        self.run("sweeper", lambda: scheduled.run(self.ctx(), now=self.clock(), jobs=[job_id]))

    # ---- the day -----------------------------------------------------------------------------------------
    def play(self) -> CloudDay:
        rates = self.store_faults.rate, self.cloud_faults.rate
        while self.minute < DAY_MINUTES:
            calm = self.minute >= FAULTY_MINUTES
            self.store_faults.rate, self.cloud_faults.rate = (0.0, 0.0) if calm else rates
            self.users()
            self.agents()
            now = self.clock()
            self.run("sweeper", lambda: scheduled.run(self.ctx(), now=now))  # noqa: B023  # run at once, in the loop
            self.run("rerun", lambda: reconcile.rerun(self.ctx(), now=now))  # noqa: B023
            if self.minute % 5 == 0:
                self.run("launcher", lambda: launcher.backstop(self.ctx(), now=now, min_age=60))  # noqa: B023
            if self.minute % 10 == 0:
                self.run("uptime-cap", lambda: reconcile.uptime_cap(self.ctx(), now=now))  # noqa: B023
            self.clock.advance(timedelta(minutes=1).total_seconds())
        return self

    # ---- what the day shows ------------------------------------------------------------------------------
    def ends(self) -> dict[str, tuple[State | None, int]]:
        out: dict[str, tuple[State | None, int]] = {}
        for job in JOBS:
            try:
                record = self.truth.job(job.id)
                out[job.id] = (record.state, record.restarts)
            except JobNotFound:
                out[job.id] = (None, 0)
        return out

    def duplicates(self) -> list[str]:
        ranks = Counter((i.job_id, i.attempt, i.rank) for i in self.cloud.instances(managed=True))
        return [f"{job} attempt {attempt} rank {rank}: {n} VMs" for (job, attempt, rank), n in ranks.items() if n > 1]

    def resumed(self) -> int:
        return sum(1 for job in JOBS for e in self.truth.events(job.id) if e.get("cause") == "resume-launch")

    def waited(self) -> int:
        return sum(1 for job in JOBS for e in self.truth.events(job.id) if e.get("to") == State.WAITING_CAPACITY)


def test_a_day_of_cloud_faults_ends_as_the_fault_free_day(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CAS's backoff: no waiting on this clock
    monkeypatch.setattr(rooted, "time", SimpleNamespace(sleep=lambda _s: None))
    calm = CloudDay(0, 0.0, 0.0).play()
    expected = calm.ends()
    assert {job: state for job, (state, _) in expected.items()} == {
        "one": State.SUCCEEDED, "pair": State.SUCCEEDED, "spot": State.SUCCEEDED, "spot-pair": State.SUCCEEDED,
        "fails": State.FAILED, "cancelled": State.CANCELLED, "late": State.SUCCEEDED}
    assert expected["spot"][1] == expected["spot-pair"][1] == 1 and calm.duplicates() == []

    faults: Counter[str] = Counter()
    problems, hidden, resumed, waited, failed = [], 0, 0, 0, Counter[str]()
    for seed in SEEDS:
        day = CloudDay(seed, STORE_RATE, CLOUD_RATE).play()
        faults.update(day.store_faults.counts)
        faults.update(day.cloud_faults.counts)
        hidden, resumed, waited = hidden + day.faulty.hidden, resumed + day.resumed(), waited + day.waited()
        failed.update(day.failed_runs)
        problems += [f"seed {seed}: {job} ended {got}, the fault-free day {expected[job]}"
                     for job, got in day.ends().items() if got != expected[job]]
        problems += [f"seed {seed}: launched twice: {d}" for d in day.duplicates()]
        problems += [f"seed {seed}: terminated wrongly: {w}" for w in day.compute.wrongful]
        problems += [f"seed {seed}: {i.id} of {i.job_id} still {i.state}"
                     for i in day.cloud.instances(managed=True, live=True)]
        problems += [f"seed {seed}: drop left: {k}" for k, _, _ in day.truth.listing(keys.QUEUE)]
    assert not problems, "\n".join(problems)
    # every path was met: each kind of fault on the store and the cloud, a listing without a new instance, a launch
    # resumed after its answer was lost (its VMs adopted by their tags) and a multi-node launch waiting for capacity
    assert {"s3 error", "s3 lost", "ec2 error", "ec2 lost", "ec2 capacity"} <= set(faults), faults
    assert hidden > 0 and resumed > 0 and waited > 0, (hidden, resumed, waited)
    print(f"\n{len(SEEDS)} seeds at {STORE_RATE} (store), {CLOUD_RATE} (cloud): faults {dict(sorted(faults.items()))}; "
          f"listings that hid a new VM "
          f"{hidden}; launches resumed {resumed}; capacity waits {waited}; function runs failed {dict(failed)}")
