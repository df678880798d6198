"""Admission at scale against Kueue's own benchmark (issue 58): Kueue's scheduler scalability baseline
(kubernetes-sigs/kueue test/performance/scheduler/configs/baseline) replayed through jobplane's real launcher, check
and admission code, on the in-memory store and the manual clock.

Kueue's baseline: 30 ClusterQueues (5 cohorts of 6) of nominal quota 20, each borrowing up to 100 more in its cohort;
per queue 350 small workloads (1 unit, 200 ms, priority 50) created every 100 ms, 100 medium (5 units, 500 ms, priority
100) every 500 ms, 50 large (20 units, 1,000 ms, priority 200) every 1,200 ms: 15,000. Its published figures (the mean
of 5 runs): wall 351 s, usage 58.7%, mean time to admission small 215 s, medium 77 s, large 6.7 s.

Here: 30 owners whose fair share of a deployment cap of 600 nodes is 20 each (equal owner_weights), each owner's own
quota 20 plus Kueue's borrowing limit of 100 (`--borrow 0`: quotas of 20); the classes as priority classes of those
values; a node per unit. Each drop is the launcher's run on its event, at most as many at once as the stack's reserved
concurrency gives the launcher (infra/aws/control_plane.py); each exit report's event asks for the check (the sweeper:
one run at a time, so the events that arrive while one runs are taken together by the next, as the runs Lambda would
queue each find them ended by then); the launcher's backstop and the scheduled check every 5 minutes. Every store call
a run makes costs it `--latency-ms` of virtual time (S3's and GCS's small objects take 10 to 30 ms), and the runs
interleave at their store calls, so their compare-and-swaps race as they would; a VM boots at once (as Kueue's pods,
admitted, start) and its agent writes its exit report when its runtime is over. Measured:
- `over_admitted`: launches at which the admitted nodes (launched, not yet ended in their records) passed the
  owner's quota or the cap, plus audits (every 2 s, times the time scale) that found a record over its limit;
- `usage_percent`: the nodes admission holds (from a job's launch to the write that ends it) over the cap, on
  average while work waits (from the first drop to the last job's launch); `busy_percent` the same for the nodes
  whose job's code runs;
- `mean_admission_s` by class: from the drop to its launch request (which follows the admission's writes);
- `store_calls_per_job`, by function; `wall_s`: virtual seconds from the first drop to the last job's end (a job
  not launched or ended by `--limit-s` counts to then); `run_s`: real seconds this took.

    .venv/bin/python bench/queue_scale.py       # the baseline (30 owners, 15,000 jobs), then its variants (VARIANTS)
    .venv/bin/python bench/queue_scale.py --owners 2 --fraction 0.02 --no-variants   # a tiny one
Writes bench/results/queue_scale.json (and prints it).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import heapq
import itertools
import json
import random
import re
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import report  # noqa: E402

from jobplane.boot import agent_bundle  # noqa: E402
from jobplane.clouds.base import Instance, LaunchRequest, ObjectInfo  # noqa: E402
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore  # noqa: E402
from jobplane.control import launcher, scheduled  # noqa: E402
from jobplane.deployment.context import Context  # noqa: E402
from jobplane.deployment.telemetry import CountingMetrics  # noqa: E402
from jobplane.model import images, keys, records  # noqa: E402
from jobplane.model.jobrecord import JobRecord  # noqa: E402
from jobplane.model.states import TERMINAL  # noqa: E402
from jobplane.store import admission as admission_store  # noqa: E402
from jobplane.store import registry as registry_module  # noqa: E402
from jobplane.store import rooted  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CLASSES = {  # Kueue's baseline per queue: (count, every ms, units, runtime ms, priority)
    "small": (350, 100, 1, 200, 50),
    "medium": (100, 500, 5, 500, 100),
    "large": (50, 1200, 20, 1000, 200),
}
KUEUE = {"wall_s": 351.1, "usage_percent": 58.7, "mean_admission_s": {"small": 215.5, "medium": 76.8, "large": 6.7}}
CRON_S = 300  # the launcher's backstop and the scheduled check: rate(5 minutes)


def reserved_launchers() -> int:
    """The launcher's reserved concurrency in the AWS stack (read from its source: the CDK is not imported here)."""
    text = (ROOT / "infra" / "aws" / "control_plane.py").read_text()
    found = re.search(r'FunctionSpec\("launcher",[^)]*reserved=(\d+)\)', text)
    assert found, "infra/aws/control_plane.py names no launcher reserved concurrency"
    return int(found.group(1))


# ---- virtual time ---------------------------------------------------------------------------------------------
@dataclass
class Task:
    kind: str  # "launcher", "sweeper"
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))


class Sim:
    """Virtual time for the real code's runs: each run is a thread, one runs at a time, and it gives way at each
    store call, which moves its own time on by the call's latency; the heap holds the runs to resume and the events
    (drops, exit reports, crons) by their time."""

    def __init__(self, clock: Clock, latency: float, seed: int = 58) -> None:
        self.clock, self.latency = clock, latency
        self.heap: list[tuple[datetime, int, Any]] = []
        self.order = itertools.count()
        self.baton = threading.Semaphore(0)
        self.local = threading.local()
        self.calls: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()  # "sweeper GET job.json": what the calls were
        self.random = random.Random(seed)
        self.errors: list[str] = []

    def at(self, when: datetime, event: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (when, next(self.order), event))

    def spawn(self, kind: str, run: Callable[[], object], done: Callable[[], None]) -> None:
        task = Task(kind)

        def body() -> None:
            task.go.acquire()
            self.local.task = task
            try:
                run()
            except BaseException as exc:  # a run's error is the bench's finding, not its end
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            finally:
                done()
                self.baton.release()

        threading.Thread(target=body, daemon=True).start()
        heapq.heappush(self.heap, (self.clock.now, next(self.order), task))

    def wait(self, seconds: float) -> None:
        """The running task spends `seconds` of its own time (a store call, a backoff); elsewhere, nothing."""
        task: Task | None = getattr(self.local, "task", None)
        if task is None:
            return
        heapq.heappush(self.heap, (self.clock.now + timedelta(seconds=seconds), next(self.order), task))
        self.baton.release()
        task.go.acquire()

    def call(self, op: str, key: str) -> None:
        task: Task | None = getattr(self.local, "task", None)
        if task is not None:
            self.calls[task.kind] += 1
            self.by_key[f"{task.kind} {op} {what(key)}"] += 1
            self.wait(self.latency)

    def run(self, until: datetime) -> None:
        while self.heap and self.heap[0][0] <= until:
            when, _, item = heapq.heappop(self.heap)
            self.clock.now = max(self.clock.now, when)
            if isinstance(item, Task):
                item.go.release()
                self.baton.acquire()
            else:
                item()


def what(key: str) -> str:
    """A key's kind: its first folder, and a job's job.json, events and attempts apart, an admission record's kind."""
    parts = key.split("/")
    if parts[0] == "jobs" and len(parts) > 2:
        return f"jobs/*/{parts[2]}"
    return "/".join(parts[:2]) if parts[0] == "admission" else parts[0]


class TimedStore(MemoryStore):
    """A MemoryStore whose every call a run makes costs that run the latency, and whose sorted keys are kept up as
    keys come and go (MemoryStore sorts them again after each new key: too slow for 15,000 jobs' keys)."""

    def __init__(self, clock: Clock, sim: Sim) -> None:
        super().__init__(clock)
        self.sim = sim
        self._ordered: list[str] = []

    def _write(self, key: str, parts: tuple[bytes, ...]) -> str:
        if key not in self._objects:
            bisect.insort(self._ordered, key)
        version = super()._write(key, parts)
        self._sorted = self._ordered
        return version

    def _keys(self) -> list[str]:
        return self._ordered

    def get(self, key: str) -> Any:
        self.sim.call("GET", key)
        return super().get(key)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self.sim.call("PUT", key)
        return super().put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json", tags: Any = None) -> str:
        self.sim.call("PUT", key)
        return super().put_if_absent(key, data, content_type, tags=tags)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        self.sim.call("PUT", key)
        return super().put_if_match(key, data, version, content_type)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        self.sim.call("LIST", prefix)
        for n, info in enumerate(super().list(prefix, page_size)):
            if n and n % page_size == 0:
                self.sim.call("LIST", prefix)  # the next page
            yield info

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        self.sim.call("LIST", prefix)
        yield from super().folders(prefix, page_size)

    def delete(self, key: str) -> None:
        self.sim.call("DELETE", key)
        with self._lock:
            if key in self._objects:
                at = bisect.bisect_left(self._ordered, key)
                del self._ordered[at]
                del self._objects[key]
            self._sorted = self._ordered


# ---- the replay -------------------------------------------------------------------------------------------------
@dataclass
class Job:
    job_id: str
    owner: str
    kind: str
    nodes: int
    runtime: float  # s
    submitted: datetime
    launched: datetime | None = None  # its launch request
    ended: datetime | None = None  # the write that ended it


@dataclass
class Pool:
    """A function's runs: at most `limit` at once, the rest queued in order (Lambda's async invocations)."""

    sim: Sim
    kind: str
    limit: int
    running: int = 0
    queued: deque[Callable[[], object]] = field(default_factory=deque)

    def invoke(self, run: Callable[[], object]) -> None:
        if self.running < self.limit:
            self.running += 1
            self.sim.spawn(self.kind, run, self._done)
        else:
            self.queued.append(run)

    def _done(self) -> None:
        if self.queued:
            self.sim.spawn(self.kind, self.queued.popleft(), self._done)
        else:
            self.running -= 1


def policy(owners: int, quota: int, borrow: int) -> bytes:
    return (f"max_active_instances_per_owner: {quota + borrow}\nmax_active_instances: {owners * quota}\n"
            f"max_nodes_per_job: 20\ndefault_max_wait: 1d\n"
            "priority_classes: {small: {value: 50}, medium: {value: 100}, large: {value: 200}}\n").encode()


class Replay:
    """One replay: the deployment in memory, the users' drops, the agents, the functions' runs and what they did."""

    def __init__(self, owners: int, latency_ms: float, launchers: int, quota: int, borrow: int, scale: float) -> None:
        self.clock = Clock(START)
        self.sim = Sim(self.clock, latency_ms / 1000)
        self.reg = Registry(TimedStore(self.clock, self.sim))
        self.reg.put(keys.agent_file(agent_bundle.MANIFEST), agent_bundle.manifest([  # as a deployment uploads it
            agent_bundle.Variant("aws", python, arch, "0" * 64, 1) for python in images.python_versions()
            for arch in images.ARCHITECTURES]))
        self.reg.put(keys.POLICY, policy(owners, quota, borrow))
        self.reg.listeners.append(self.ended)
        self.compute = MemoryCompute(self.clock, boot=0, shutdown=0)
        self.real_launch = self.compute.launch
        self.compute.launch = self.launch  # type: ignore[method-assign]
        self.cap, self.limit, self.scale = owners * quota, quota + borrow, scale
        self.jobs: dict[str, Job] = {}
        self.held: Counter[str] = Counter()  # nodes launched and not yet ended in their records, per owner and "*"
        self.over = {"launches": 0, "audits": 0}
        self.launchers, self.sweeper = Pool(self.sim, "launcher", launchers), Pool(self.sim, "sweeper", 1)
        self.pending: set[str] = set()  # the jobs whose exit reports' events wait for the check
        self.checking = False

    def ctx(self) -> Context:
        return Context(self.reg, self.compute, self.reg.policy(), CountingMetrics())

    def left(self) -> bool:
        return any(j.ended is None for j in self.jobs.values())

    # ---- the users and the agents ------------------------------------------------------------------------------
    def drop(self, job: Job) -> None:
        key = keys.queue_entry(job.job_id, job.owner, "yaml")
        self.reg.put(key, f"run: python3 train.py\ninstance_type: t3.micro\nnum_nodes: {job.nodes}\n"
                          f"priority: {job.kind}\n".encode())
        self.launchers.invoke(lambda: launcher.handle_drop(self.ctx(), key, now=self.clock()))

    def launch(self, request: LaunchRequest) -> list[Instance]:
        made = self.real_launch(request)
        job = self.jobs[request.job_id]
        job.launched = job.launched or self.clock()
        self.held[job.owner] += job.nodes
        self.held["*"] += job.nodes
        if self.held[job.owner] > self.limit or self.held["*"] > self.cap:
            self.over["launches"] += 1
        self.sim.at(self.clock(), lambda: self.beats(job, request.attempt, made))  # the agents' calls, not the run's
        self.sim.at(self.clock() + timedelta(seconds=job.runtime), lambda: self.exits(job, request.attempt, made))
        return made

    def beats(self, job: Job, attempt: int, made: list[Instance]) -> None:
        for rank in range(len(made)):
            self.reg.put_json(keys.heartbeat(job.job_id, attempt, rank), {"time": self.clock().isoformat()})

    def exits(self, job: Job, attempt: int, made: list[Instance]) -> None:
        for rank, inst in enumerate(made):
            self.reg.put_json(keys.exit_report(job.job_id, attempt, rank),
                              records.ExitReport(code=0, reason="exit", instance_id=inst.id).body())
            self.compute.reclaim(inst.id)
        self.pending.add(job.job_id)
        self.check()

    def ended(self, old: JobRecord, new: JobRecord) -> None:
        job = self.jobs.get(new.id)
        if job is not None and new.state in TERMINAL and old.state not in TERMINAL:
            job.ended = self.clock()
            if job.launched is not None:
                self.held[job.owner] -= job.nodes
                self.held["*"] -= job.nodes

    # ---- the functions -------------------------------------------------------------------------------------------
    def check(self) -> None:
        """The sweeper's run for the events waiting (one run at a time: those that come meanwhile, the next)."""
        if self.checking:
            return
        self.checking = True

        def run() -> None:
            try:
                while True:
                    named = sorted(self.pending)
                    self.pending.clear()
                    scheduled.run(self.ctx(), now=self.clock(), jobs=named)
                    if not self.pending:
                        return
            finally:
                self.checking = False

        self.sweeper.invoke(run)

    def cron(self) -> None:
        self.launchers.invoke(lambda: launcher.backstop(self.ctx(), now=self.clock()))
        self.check()
        jobs, at = self.jobs.values(), (self.clock() - START).total_seconds()  # how far it is, for the one waiting
        print(f"{at:,.0f} s: {sum(j.launched is not None for j in jobs):,} launched, "
              f"{sum(j.ended is not None for j in jobs):,} ended of {len(jobs):,}", file=sys.stderr, flush=True)
        if self.left():
            self.sim.at(self.clock() + timedelta(seconds=CRON_S), self.cron)

    def audit(self) -> None:
        """Every admission record within its limit, read as it stands (no run's call)."""
        deployment = admission_store.read(self.reg, keys.ADMISSION_DEPLOYMENT)[0]
        lines = [admission_store.read(self.reg, k)[0] for k, _, _ in self.reg.listing(keys.ADMISSION_OWNERS)]
        if deployment.used() > self.cap or any(line.used() > self.limit for line in lines):
            self.over["audits"] += 1
        if self.left():
            self.sim.at(self.clock() + timedelta(seconds=2 * self.scale), self.audit)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """The store's backoff after a lost compare-and-swap spends virtual time, and the in-order admission's calls
        are counted apart (the launches a freed slot admits)."""
        real_in_order, backoffs = launcher.admit_in_order, [m.backoff for m in BACKOFFS]

        def jittered(tries: int) -> None:
            self.sim.wait(self.sim.random.uniform(0, min(1.0, 0.01 * 2**tries)))

        def in_order(*args: Any, **kwargs: Any) -> list[str]:
            task: Task = self.sim.local.task
            kind, task.kind = task.kind, f"{task.kind} in order"
            try:
                return real_in_order(*args, **kwargs)
            finally:
                task.kind = kind

        launcher.admit_in_order = in_order
        for module in BACKOFFS:
            module.backoff = jittered  # type: ignore[attr-defined]
        try:
            yield
        finally:
            launcher.admit_in_order = real_in_order
            for module, real in zip(BACKOFFS, backoffs, strict=True):
                module.backoff = real  # type: ignore[attr-defined]

    def run(self, owners: int, fraction: float, limit_s: float) -> None:
        for o in range(owners):
            owner = f"team-{o:02d}"
            for kind, (count, every, units, runtime, _) in CLASSES.items():
                for n in range(max(1, round(count * fraction))):
                    job = Job(f"{owner}-{kind[0]}{n:03d}", owner, kind, units, self.scale * runtime / 1000,
                              START + timedelta(milliseconds=self.scale * n * every))
                    self.jobs[job.job_id] = job
                    self.sim.at(job.submitted, functools.partial(self.drop, job))
        self.sim.at(START + timedelta(seconds=CRON_S), self.cron)
        self.sim.at(START + timedelta(seconds=2 * self.scale), self.audit)
        with self.timed():
            self.sim.run(until=START + timedelta(seconds=limit_s))


BACKOFFS = (rooted, admission_store, registry_module)  # the modules that hold the store's backoff by name


def replay(owners: int, fraction: float, latency_ms: float, launchers: int, quota: int, borrow: int,
           limit_s: float, scale: float = 1.0) -> dict[str, Any]:
    began = time.monotonic()
    done = Replay(owners, latency_ms, launchers, quota, borrow, scale)
    done.run(owners, fraction, limit_s)
    return measured(done, began, dict(owners=owners, fraction=fraction, latency_ms=latency_ms, launchers=launchers,
                                      quota=quota, borrow=borrow, cap=done.cap, time_scale=scale))


def measured(done: Replay, began: float, config: dict[str, Any]) -> dict[str, Any]:
    """The figures; a job not launched when the replay stopped (its limit) counts its wait up to then."""
    jobs, stop = list(done.jobs.values()), done.clock()
    spans = [(j, j.launched, j.ended or stop) for j in jobs if j.launched is not None]
    first = min(j.submitted for j in jobs)
    last_launch = stop if len(spans) < len(jobs) else max(launched for _, launched, _ in spans)
    waits = (last_launch - first).total_seconds() or 1.0

    def average(intervals: list[tuple[datetime, datetime, int]]) -> float:
        total = sum(n * max(0.0, (min(b, last_launch) - max(a, first)).total_seconds()) for a, b, n in intervals)
        return round(100 * total / (done.cap * waits), 1)

    by_class = {kind: [((j.launched or stop) - j.submitted).total_seconds() for j in jobs if j.kind == kind]
                for kind in CLASSES}
    calls = dict(done.sim.calls.most_common())
    return {
        "bench": "queue_scale", "measured_at": datetime.now(UTC).isoformat(), "config": config, "kueue": KUEUE,
        "jobs": len(jobs), "owners": config["owners"], "launched": len(spans),
        "finished": sum(j.ended is not None for j in jobs),
        "over_admitted": done.over["launches"] + done.over["audits"],
        "usage_percent": average([(a, b, j.nodes) for j, a, b in spans]),
        "busy_percent": average([(a, a + timedelta(seconds=j.runtime), j.nodes) for j, a, _ in spans]),
        "mean_admission_s": {k: round(sum(v) / len(v), 2) if v else None for k, v in by_class.items()},
        "max_admission_s": {k: round(max(v), 2) if v else None for k, v in by_class.items()},
        "store_calls_per_job": round(sum(calls.values()) / len(jobs), 1), "store_calls": calls,
        "store_calls_by_key": dict(done.sim.by_key.most_common(25)),
        "wall_s": round((max((e for _, _, e in spans), default=first) - first).total_seconds(), 1),
        "run_s": round(time.monotonic() - began, 1),
        "errors": done.sim.errors[:10], "error_count": len(done.sim.errors),
    }


VARIANTS = {  # name: (time scale, latency ms): run at a tenth of the jobs at most, beside the baseline as given
    "training time": (100.0, None),  # every runtime and interval x100: jobs of 20 s to 100 s, the store as given
    "training time, 1 ms store": (100.0, 1.0),  # and a store 20 times faster: what the admission's order allows
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=1.0, help="of each class's count per owner")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="each store call's")
    parser.add_argument("--launchers", type=int, default=None, help="runs at once (default: the stack's)")
    parser.add_argument("--quota", type=int, default=20, help="each owner's fair share of the cap")
    parser.add_argument("--borrow", type=int, default=100, help="nodes an owner's quota has beyond its share")
    parser.add_argument("--time-scale", type=float, default=1.0, help="runtimes and intervals times this")
    parser.add_argument("--limit-s", type=float, default=20_000, help="virtual seconds a replay may take (x scale)")
    parser.add_argument("--no-variants", action="store_true", help="the baseline only")
    args = parser.parse_args(argv)
    launchers = args.launchers or reserved_launchers()

    def one(fraction: float, scale: float, latency_ms: float) -> dict[str, Any]:
        result = replay(args.owners, fraction, latency_ms, launchers, args.quota, args.borrow, args.limit_s * scale,
                        scale)
        print(json.dumps({k: result[k] for k in ("jobs", "over_admitted", "usage_percent", "busy_percent",
                                                 "mean_admission_s", "wall_s", "run_s")}), file=sys.stderr, flush=True)
        return result

    result = one(args.fraction, args.time_scale, args.latency_ms)
    if not args.no_variants:
        result["variants"] = {}
        for name, (scale, latency_ms) in VARIANTS.items():
            found = one(min(args.fraction, 0.1), scale, latency_ms or args.latency_ms)
            found["mean_admission_kueue_time_s"] = {k: None if v is None else round(v / scale, 2)
                                                    for k, v in found["mean_admission_s"].items()}
            result["variants"][name] = {k: v for k, v in found.items() if k not in ("bench", "kueue")}
    return report.save("queue_scale", result)


if __name__ == "__main__":
    raise SystemExit(main())
