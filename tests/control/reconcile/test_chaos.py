"""A chaos day: two deployments share one bucket and one account while every store call may fail.

Everything runs in memory on one clock (tests/control/reconcile/day.py's pieces). The faults are the ones a cloud
serves: a 5xx the SDK gave up on, a response lost after the write landed (the SDK resends the request, and a
conditional write's resend finds its own write), a function that dies between any two of its writes (a
Lambda timeout, an OOM), and events lost or delivered twice. The agents are simulated, but they sync real
checkpoint files with the agent's own CheckpointSync, through the same faulty store.

After the faults stop and the functions have had an hour to catch up, the day must show:
- every job in the state its facts justify (exit 0: SUCCEEDED, exit 1: FAILED, cancelled: CANCELLED, a bad
  drop: INVALID), and every Spot job that was preempted resumed from its newest checkpoint;
- no VM of one deployment touched by the other's functions, and no VM left running;
- no drop lost: every drop became a job record or a rejection;
- no checkpoint manifest naming a missing object, although a survivor the rerun terminates runs its final
  sync (a newer save, and its clean-up) between the next attempt's restore and that attempt's first manifest.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from jobplane.agent import transfer
from jobplane.agent.checkpoints import CheckpointSync
from jobplane.agent.keeper import moved_on
from jobplane.clouds.base import (
    TAG_DEPLOYMENT,
    Blob,
    FileGet,
    Instance,
    LaunchRequest,
    ObjectInfo,
    StoreError,
    download_each,
)
from jobplane.clouds.memory import Clock, MemoryCompute, MemoryStore
from jobplane.control import launcher, reconcile
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import keys, records
from jobplane.model.states import State
from jobplane.ops import cancels, jobs
from jobplane.store.registry import JobNotFound, Registry
from tests.control.reconcile.day import MORNING
from tests.helpers import data_of, in_tmpfs, publish_agent_manifest

T = TypeVar("T")
TICK = 30  # seconds of simulated time per step
FAULTS_END, DAY_END = "18:00", "19:00"


class Crash(BaseException):
    """The function's runtime died here (timeout, out of memory): nothing after this point of the run happens.
    A BaseException, so no `except Exception` in the code under test can catch it, as none could catch a kill."""


class Unavailable(StoreError):
    """A 5xx that outlived the SDK's retries."""


class FaultyStore:
    """A MemoryStore behind a flaky network and an SDK that retries.

    Each write may: crash the calling function just before it (while `armed`); land and lose its response, so
    the SDK sends it again (a conditional write's resend then fails its precondition on its own write); or
    fail with a 5xx, landed or not. Each read may fail with a 5xx. `rate` scales every fault; 0 turns them off.
    Every draw is a function of the seed, the call and how many times that call was made on that key, so a
    seed replays the same faults whatever order the agent's transfer threads run in."""

    def __init__(self, inner: MemoryStore, seed: int) -> None:
        self.inner, self.seed = inner, seed
        self.limits, self.bucket, self.vm_auth = inner.limits, inner.bucket, inner.vm_auth
        self.rate = 1.0
        self.armed = False  # a function is running: a crash ends it
        self.faults: dict[str, int] = {}
        self._calls: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _draws(self, op: str, key: str) -> random.Random:
        with self._lock:
            n = self._calls[op, key] = self._calls.get((op, key), 0) + 1
        return random.Random(f"{self.seed}/{op}/{key}/{n}")

    def _fault(self, kind: str) -> None:
        with self._lock:
            self.faults[kind] = self.faults.get(kind, 0) + 1

    def _write(self, op: str, key: str, call: Callable[[], T]) -> T:
        draw = self._draws(op, key)
        crash, unavailable, landed, resent = (draw.random() for _ in range(4))
        if self.armed and crash < 0.02 * self.rate:
            self._fault("crash")
            raise Crash
        if unavailable < 0.03 * self.rate:
            self._fault("unavailable")
            if landed < 0.5:
                call()  # it landed; the 5xx came after
            raise Unavailable("503 SlowDown (retries exhausted)")
        if resent < 0.05 * self.rate:
            self._fault("resent")
            call()  # landed; the response was lost and the SDK sends the request again
        return call()

    def _read(self, op: str, key: str) -> None:
        if self._draws(op, key).random() < 0.02 * self.rate:
            self._fault("unavailable")
            raise Unavailable("500 InternalError (retries exhausted)")

    # ---- the ObjectStore protocol ----------------------------------------------------------------------
    def get(self, key: str) -> Blob:
        self._read("get", key)
        return self.inner.get(key)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        self._read("list", prefix)
        return self.inner.list(prefix, page_size)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._write("put", key, lambda: self.inner.put(key, data, content_type))

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        return self._write("put_if_absent", key, lambda: self.inner.put_if_absent(key, data, content_type, tags))

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        return self._write("put_if_match", key, lambda: self.inner.put_if_match(key, data, version, content_type))

    def delete(self, key: str) -> None:
        self._write("delete", key, lambda: self.inner.delete(key))

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Any = None) -> str:
        return self._write("upload_file", key, lambda: self.inner.upload_file(key, path, content_type, progress))

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Any = None) -> str:
        self._read("download_file", key)
        return self.inner.download_file(key, path, version=version, size=size, progress=progress)

    def download_files(self, gets: Sequence[FileGet]) -> list[str | Exception]:
        return download_each(self, gets)  # each through download_file, and its faults

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        return self.inner.vm_request(key, write=write, expires=expires)


@dataclass
class Script:
    """What one job's code does: trains `minutes` (resuming from its checkpoint), then exits with `code`."""

    job_id: str
    submit_at: int  # minutes after 12:00
    minutes: int
    code: int = 0
    nodes: int = 1
    spot: bool = False
    preempt_at: int | None = None  # minutes of training in attempt 1 after which the cloud reclaims rank 0
    cancel_at: int | None = None  # minutes after the submission the user cancels
    invalid: bool = False

    def expected(self) -> State | None:
        """The state its facts justify; None: no record, the drop kept under rejected/ with its reason."""
        if self.invalid:
            return None
        if self.cancel_at is not None:
            return State.CANCELLED
        return State.SUCCEEDED if self.code == 0 else State.FAILED


@dataclass
class Life:
    """One rank of one attempt on one VM: its local checkpoint directory and its sync."""

    sync: CheckpointSync
    local: Path
    base: int  # the step it resumed from
    instance_id: str
    job_id: str
    rank: int
    attempt: int
    started_at: float | None = None  # seconds into the day when training began
    watched: bool = False  # an earlier life's final sync ran between its restore and its first manifest
    step: int = 0
    saved: int | None = None  # the step its last save in place wrote
    done: bool = False


class Tracked:
    """A deployment's view of the account's one EC2 (MemoryCompute scoped to its deployment tag, as Ec2Compute
    filters): the Compute its functions use, remembering what they asked to terminate."""

    def __init__(self, cloud: MemoryCompute, deployment: str) -> None:
        self.cloud, self.region, self._cloud = "aws", cloud.region, cloud.scoped(deployment)
        self.terminated: list[str] = []

    def launch(self, request: LaunchRequest) -> list[Instance]:
        return self._cloud.launch(request)

    def list_managed(self) -> list[Instance]:
        return self._cloud.list_managed()

    def terminate(self, instance_ids: list[str]) -> None:
        self.terminated += instance_ids
        self._cloud.terminate(instance_ids)

    def console_output(self, instance_id: str) -> str:
        return self._cloud.console_output(instance_id)


@dataclass
class Deployment:
    name: str
    reg: Registry
    compute: Tracked
    scripts: dict[str, Script]
    metrics: CountingMetrics = field(default_factory=CountingMetrics)


def scripts_for(name: str, rng: random.Random) -> dict[str, Script]:
    out = [
        Script(f"{name}-ok", 0, 40),
        Script(f"{name}-fails", 5, 20, code=1),
        Script(f"{name}-pair", 10, 50, nodes=2),
        Script(f"{name}-spot", 15, 60, spot=True, preempt_at=25),
        Script(f"{name}-spot-pair", 20, 60, nodes=2, spot=True, preempt_at=30),
        Script(f"{name}-cancel", 25, 300, cancel_at=30),
        Script(f"{name}-early-cancel", 30, 300, cancel_at=0),
        Script(f"{name}-bad", 35, 10, invalid=True),
    ]
    out += [Script(f"{name}-r{i}", rng.randrange(0, 240), rng.randrange(10, 90), code=rng.choice((0, 0, 1)),
                   spot=rng.random() < 0.5, nodes=rng.choice((1, 1, 2)),
                   preempt_at=rng.choice((None, 5, 20))) for i in range(6)]
    for s in out:
        if s.preempt_at is not None and s.preempt_at >= s.minutes:
            s.preempt_at = None
        if s.preempt_at is not None:
            s.spot = True
    return {s.job_id: s for s in out}


class ChaosDay:
    def __init__(self, seed: int, tmp: Path) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock(MORNING)
        self.inner = MemoryStore(self.clock)
        self.store = FaultyStore(self.inner, seed)
        self.tmp = tmp
        self.notes: list[str] = []  # what went wrong during the day
        self.lives: dict[tuple[str, str], Life] = {}  # (deployment, instance id) -> the agent on that VM
        self.saved: dict[tuple[str, str], int] = {}  # (deployment, job) -> step rank 0 synced at its preemption
        self.resumed: dict[tuple[str, str, int], int] = {}  # (deployment, job, attempt) -> rank 0's first step
        self.cloud = MemoryCompute(self.clock, boot=60, shutdown=90)
        self.interleaved = 0  # survivors' final syncs run between a new attempt's restore and its first manifest
        self.deployments = [self._deployment(name) for name in ("prod", "staging")]

    def _deployment(self, name: str) -> Deployment:
        reg = Registry(self.store, root=name)  # type: ignore[arg-type]
        publish_agent_manifest(Registry(self.inner, root=name), "aws")
        return Deployment(name, reg, Tracked(self.cloud, f"{self.inner.bucket}/{name}"), scripts_for(name, self.rng))

    @property
    def seconds(self) -> float:
        return (self.clock() - MORNING).total_seconds()

    # ---- the functions, each run able to die between any two writes -------------------------------------
    def run(self, what: Callable[[], object]) -> None:
        self.store.armed = True
        try:
            what()
        except (Crash, Unavailable):
            pass  # the run died or failed; the next event or cron run must pick up where it stopped
        finally:
            self.store.armed = False

    def functions(self, d: Deployment, minute: int) -> None:
        now = self.clock()

        def ctx() -> Context:  # made in the run: its policy read may meet the store's faults too
            return Context(d.reg, d.compute, d.reg.policy(), d.metrics)

        self.run(lambda: reconcile.check(ctx(), now=now))
        self.run(lambda: reconcile.rerun(ctx(), now=now))
        if minute % 5 == 0:
            self.run(lambda: launcher.backstop(ctx(), now=now, min_age=60))
        if minute % 10 == 0:
            self.run(lambda: reconcile.uptime_cap(ctx(), now=now))

    def deliver(self, fn: Callable[[], object]) -> None:
        """An event: lost (the cron catches up), delivered once, or twice."""
        for _ in range(self.rng.choice((0, 1, 1, 2)) * int(self.store.rate > 0) or 1):
            self.run(fn)

    # ---- the users ---------------------------------------------------------------------------------------
    def users(self, d: Deployment, minute: int) -> None:
        for s in d.scripts.values():
            if minute == s.submit_at and self.seconds % 60 == 0:
                text = (f"run: python3 train.py\ninstance_type: t3.micro\nnum_nodes: {0 if s.invalid else s.nodes}\n"
                        f"spot: {str(s.spot).lower()}\nmax_restarts: 3\ncheckpoint_dir: /ckpt\n")
                key = keys.queue_entry(s.job_id, keys.DEFAULT_OWNER, "yaml")
                self.until_done(partial(d.reg.put, key, text.encode(), "application/yaml"))
                self.deliver(partial(self._drop_event, d, key))
            if s.cancel_at is not None and minute == s.submit_at + s.cancel_at + 1 and self.seconds % 60 == 0:
                try:
                    self.until_done(partial(cancels.cancel, d.reg, s.job_id, compute=partial(self._compute, d)))
                except jobs.JobError as exc:
                    if "already CANCELLED" in str(exc):
                        continue  # an earlier try landed; its answer was a 5xx
                    self.notes.append(f"{d.name}/{s.job_id}: cancel at minute {minute} refused: {exc}")

    def _drop_event(self, d: Deployment, key: str) -> object:
        return launcher.handle_drop(Context(d.reg, d.compute, d.reg.policy(), d.metrics), key, now=self.clock())

    @staticmethod
    def _compute(d: Deployment) -> Any:
        return d.compute

    def until_done(self, fn: Callable[[], T]) -> T:
        """A person (or an agent) tries again until it worked."""
        for _ in range(50):
            try:
                return fn()
            except Unavailable:
                continue
        raise AssertionError("50 tries all failed")

    # ---- the agents --------------------------------------------------------------------------------------
    def agents(self, d: Deployment) -> None:
        mine = [i for i in self.cloud.instances(managed=True) if self._owner(i) == d]
        self.rng.shuffle(mine)
        for inst in mine:
            self._agent(d, inst)

    def _owner(self, inst: Instance) -> Deployment | None:
        return next((d for d in self.deployments if dict(inst.tags).get(TAG_DEPLOYMENT) == d.compute._cloud.deployment),
                    None)

    def _agent(self, d: Deployment, inst: Instance) -> None:
        assert inst.job_id is not None and inst.attempt is not None and inst.rank is not None
        s, life = d.scripts[inst.job_id], self.lives.get((d.name, inst.id))
        if inst.state == "pending" or (life is not None and life.done):
            return
        if inst.state != "running":  # SIGTERM from a terminate: the agent's final sync, then it is gone
            if life is not None and inst.state == "shutting-down" and not self._rank_restored_after(life):
                return  # a slow shutdown: its final sync lands once the next attempt of its rank restored
            if life is not None and life.started_at is not None:
                self._final(life)
            if life is not None:
                life.done = True
            return
        cluster = keys.cluster(inst.job_id, inst.attempt)
        if not self._exists(d, cluster):
            return  # the agent waits for its cluster.json
        if life is None:
            try:
                data = data_of(d.reg, inst.job_id)  # the agent reads its job's record first
            except Unavailable:
                return  # it tries again (next tick)
            local = self.tmp / d.name / inst.id
            local.mkdir(parents=True, exist_ok=True)
            sync = CheckpointSync(self.store, local, d.reg.key(keys.checkpoints_prefix(data)),  # type: ignore[arg-type]
                                  rank=inst.rank, attempt=inst.attempt, settle=0.0, clock=self.clock,
                                  writers=set,  # a simulated agent writes between syncs, never during one
                                  superseded=partial(moved_on, d.reg, inst.job_id, inst.attempt),
                                  sleep=lambda _s: None)  # a retry's pause: on this clock it need not wait
            try:
                sync.restore()
            except (Unavailable, RuntimeError):
                return  # the bootstrap tries again (next tick)
            step = int((local / "state.json").read_text()) if (local / "state.json").exists() else 0
            life = self.lives[(d.name, inst.id)] = Life(sync, local, base=step, instance_id=inst.id,
                                                        job_id=inst.job_id, rank=inst.rank, attempt=inst.attempt,
                                                        started_at=self.seconds)
            if inst.rank == 0:
                self.resumed[(d.name, inst.job_id, inst.attempt)] = step
            for survivor in self._survivors(life):  # between this restore and this life's first manifest
                self.interleaved, life.watched = self.interleaved + 1, True
                self._final(survivor)
                survivor.done = True
            return  # the first periodic sync comes an interval after the start
        life.step = life.base + int((self.seconds - (life.started_at or 0)) // 60)
        if self._exists(d, keys.stop_request(inst.job_id)):
            self._exit(d, inst, life, 143, "stopped")
            return
        if s.preempt_at is not None and inst.attempt == 1 and inst.rank == 0 and life.step >= s.preempt_at:
            self._final(life)
            self.saved[(d.name, inst.job_id)] = life.step
            self._report(d, inst, 143, "preempted")
            self.until_done(lambda: d.reg.mark_preempted(inst.job_id or "", records.PreemptedMarker(
                attempt=inst.attempt or 0, rank=0, instance_id=inst.id)))
            life.done = True
            self.cloud.reclaim(inst.id)
            return
        if life.step != life.saved:  # torch.save in place, every minute (a tick is half of one)
            (life.local / "state.json").write_text(str(life.step))
            if life.step % 10 == 0 and life.step != life.base:
                (life.local / f"epoch-{life.rank}.json").write_text(str(life.step))  # a rank's own, saved less often
            life.saved = life.step
        if life.step >= s.minutes:
            self._exit(d, inst, life, s.code, "exit")
            return
        self.until_done(lambda: d.reg.put_json(keys.heartbeat(inst.job_id or "", inst.attempt or 0, inst.rank or 0),
                                               {"time": self.clock().isoformat()}))
        if inst.rank == 0:
            self.until_done(lambda: d.reg.put_json(keys.output_mark(inst.job_id or "", inst.attempt or 0, 0),
                                                   {"time": self.clock().isoformat()}))
        with contextlib.suppress(Unavailable):  # the next periodic sync tries again
            life.sync.sync()
        if life.watched:  # a survivor's final sync came between its restore and now: its manifests stand whole
            self.notes += manifests_missing_objects(self.inner, life.sync.prefix)

    def _final(self, life: Life) -> None:
        (life.local / "state.json").write_text(str(life.step))
        (life.local / f"epoch-{life.rank}.json").write_text(str(life.step))
        self.until_done(lambda: life.sync.sync(final=True))

    def _survivors(self, new: Life) -> list[Life]:
        """Earlier lives of the new life's rank still shutting down, their final sync not yet run."""
        return [life for life in self.lives.values() if not life.done and life.started_at is not None
                and (life.job_id, life.rank) == (new.job_id, new.rank) and life.attempt < new.attempt
                and self.cloud.state(life.instance_id) == "shutting-down"]

    def _rank_restored_after(self, life: Life) -> bool:
        return any((other.job_id, other.rank) == (life.job_id, life.rank) and other.attempt > life.attempt
                   for other in self.lives.values())

    def _exit(self, d: Deployment, inst: Instance, life: Life, code: int, reason: str) -> None:
        self._final(life)
        self._report(d, inst, code, reason)
        life.done = True
        self.cloud.reclaim(inst.id)  # the agent powers the VM off
        job_id = inst.job_id or ""
        self.deliver(lambda: reconcile.check(Context(d.reg, d.compute, d.reg.policy(), d.metrics), now=self.clock(),
                                             jobs=[job_id]))

    def _report(self, d: Deployment, inst: Instance, code: int, reason: str) -> None:
        report = records.ExitReport(code=code, reason=reason, instance_id=inst.id)
        self.until_done(lambda: d.reg.put_json(keys.exit_report(inst.job_id or "", inst.attempt or 0,
                                                                inst.rank or 0), report.body()))

    def _exists(self, d: Deployment, key: str) -> bool:
        try:
            self.inner.get(d.reg.key(key))
            return True
        except Exception:
            return False

    # ---- the day ---------------------------------------------------------------------------------------
    def play(self) -> None:
        faults_end = MORNING.replace(hour=int(FAULTS_END[:2]))
        day_end = MORNING.replace(hour=int(DAY_END[:2]))
        while self.clock() < day_end:
            self.store.rate = 1.0 if self.clock() < faults_end else 0.0
            minute = int(self.seconds // 60)
            for d in self.deployments:
                self.users(d, minute)
                self.agents(d)
                if self.seconds % 60 == 0:
                    self.functions(d, minute)
            self.clock.advance(TICK)


def manifests_missing_objects(store: MemoryStore, under: str = "") -> list[str]:
    missing = []
    present = {info.key for info in store.list(under)}
    for key in sorted(present):
        if "/checkpoints/" in key and "/manifests/" in key and key.endswith(".json"):
            body = json.loads(store.get(key).data)
            prefix = key[:key.index("/checkpoints/") + len("/checkpoints/")]
            missing += [f"{key} names {e['key']}" for e in body["files"].values() if prefix + e["key"] not in present]
    return missing


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """The VMs' checkpoint directories in tmpfs where there is one: each simulated save truncates and rewrites a
    file, which on ext4 starts its write-back at once (a tenth of the day's CPU)."""
    with in_tmpfs("chaos-day-", tmp_path) as where:
        yield where


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_day_of_faults_ends_with_every_job_where_its_facts_put_it(seed: int, disk: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # the agent's transfer retries back off in real seconds; on this clock they need not wait
    monkeypatch.setattr(transfer, "time", SimpleNamespace(sleep=lambda _s: None, monotonic=transfer.time.monotonic))
    day = ChaosDay(seed, disk)
    day.play()
    assert sum(day.store.faults.values()) > 100, day.store.faults  # the day really was faulty
    assert day.interleaved > 0  # and a survivor's final sync came between a restore and its first manifest

    problems = list(dict.fromkeys(day.notes))
    for d in day.deployments:
        for s in d.scripts.values():
            try:
                record = d.reg.job(s.job_id)
            except JobNotFound:
                if s.expected() is not None or not day._exists(d, keys.rejected_error(s.job_id)):
                    problems.append(f"{d.name}/{s.job_id}: no record and no rejection (the drop was lost)")
                continue
            if record.state != s.expected():
                problems.append(f"{d.name}/{s.job_id}: {record.state} ({record.reason}), expected {s.expected()}")
            if s.preempt_at is not None and record.state == State.SUCCEEDED and record.attempt < 2:
                problems.append(f"{d.name}/{s.job_id}: preempted but finished in attempt {record.attempt}")
            if s.preempt_at is not None and record.attempt > 1:
                saved = day.saved.get((d.name, s.job_id))
                later = sorted((n, step) for (name, job, n), step in day.resumed.items()
                               if (name, job) == (d.name, s.job_id) and n > 1)
                if saved is None or not later or later[0][1] < saved:
                    problems.append(f"{d.name}/{s.job_id}: attempt 1 saved step {saved} at its preemption, the "
                                    f"next attempt to run resumed from {later[0] if later else None}")
        others = {i.id for i in day.cloud.instances() if day._owner(i) is not d}
        problems += [f"{d.name} terminated {iid} of another deployment" for iid in d.compute.terminated
                     if iid in others]
        assert list(d.reg.listing(keys.QUEUE)) == [], f"{d.name}: drops left in queue/"
    live = [i for i in day.cloud.instances(managed=True, live=True)]
    problems += [f"{i.id} of {i.job_id} attempt {i.attempt} still {i.state}" for i in live]
    problems += manifests_missing_objects(day.inner)
    assert not problems, "\n".join(problems)

