"""In-memory ObjectStore and Compute with the semantics of the clouds' (for unit and scenario tests), and a
clock they share that moves only when a test says.

Objects are kept as the parts they arrived in: upload_file reads a file part by part and download_file
writes it back the same way, so a transfer never holds more than one part beyond what the store keeps, as
the cloud stores' streaming transfers do.
"""

from __future__ import annotations

import bisect
import builtins
import copy
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from jobplane.clouds.base import (
    TAG_ATTEMPT,
    TAG_DEPLOYMENT,
    TAG_JOB_ID,
    TAG_MANAGED,
    TAG_OWNER,
    Blob,
    CapacityError,
    FileGet,
    Instance,
    LaunchRejected,
    LaunchRequest,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    Progress,
    TransferLimits,
    download_each,
)
from jobplane.clouds.streams import atomic_file, read_parts
from jobplane.model.secrets import SecretInfo, SecretMissing


@dataclass(frozen=True)
class _Stored:
    parts: tuple[bytes, ...]
    version: str
    last_modified: datetime

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


class MemoryStore:
    """Thread-safe dict of key -> object; versions are a global counter, like GCS generations.

    It gives VMs memory:// URLs (VmUrls) so the launcher renders real startup scripts; no VM here fetches them."""

    bucket = "memory"
    vm_auth: str | None = None

    def __init__(self, clock: Callable[[], datetime] | None = None, limits: TransferLimits | None = None) -> None:
        self._objects: dict[str, _Stored] = {}
        self._sorted: builtins.list[str] | None = []  # the keys in order, None once a key came or went
        self._lock = threading.Lock()
        self._counter = 0
        self._clock = clock or (lambda: datetime.now(UTC))
        self.limits = limits or TransferLimits()
        self.calls: dict[str, int] = {}
        self.served: dict[str, builtins.list[int]] = {}  # key -> sizes of the pieces download_file wrote

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def _write(self, key: str, parts: tuple[bytes, ...]) -> str:
        self._counter += 1
        version = str(self._counter)
        if key not in self._objects:
            self._sorted = None
        self._objects[key] = _Stored(parts, version, self._clock())
        return version

    def get(self, key: str) -> Blob:
        with self._lock:
            self._count("get")
            try:
                obj = self._objects[key]
            except KeyError:
                raise NotFound(key) from None
        data = obj.parts[0] if len(obj.parts) == 1 else b"".join(obj.parts)
        return Blob(data=data, version=obj.version, last_modified=obj.last_modified)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        with self._lock:
            self._count("put")
            return self._write(key, (bytes(data),))

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        with self._lock:
            self._count("put")
            if key in self._objects:
                raise PreconditionFailed(f"{key} exists")
            return self._write(key, (bytes(data),))  # tags only feed cloud lifecycle rules: none here

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        with self._lock:
            self._count("put")
            current = self._objects.get(key)
            if current is None or current.version != version:
                raise PreconditionFailed(f"{key} changed")
            return self._write(key, (bytes(data),))

    def _keys(self) -> builtins.list[str]:
        """Every key in order (under the lock): sorted again only after a key was added or removed."""
        if self._sorted is None:
            self._sorted = sorted(self._objects)
        return self._sorted

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        start = prefix
        while True:
            with self._lock:
                self._count("list")
                ordered = self._keys()
                at = bisect.bisect_left(ordered, start)
                keys = list(itertools.takewhile(lambda k: k.startswith(prefix), ordered[at:at + page_size + 1]))
                more = len(keys) > page_size  # S3's IsTruncated: a full last page asks for no empty one after it
                page = [ObjectInfo(key=k, last_modified=self._objects[k].last_modified, size=self._objects[k].size,
                                   version=self._objects[k].version) for k in keys[:page_size]]
            yield from page
            if not more:
                return
            start = page[-1].key + "\0"

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        start = prefix
        while True:
            page: builtins.list[str] = []
            with self._lock:
                self._count("list")
                ordered = self._keys()
                at = bisect.bisect_left(ordered, start)
                while at < len(ordered) and ordered[at].startswith(prefix):
                    cut = ordered[at].find("/", len(prefix))
                    if cut < 0:  # a key, not a folder: a delimiter listing hands it back apart
                        at += 1
                        continue
                    if len(page) == page_size:
                        break  # another folder follows: the page is truncated
                    page.append(ordered[at][:cut + 1])
                    at = bisect.bisect_left(ordered, page[-1][:-1] + "0", at)  # "0" sorts right after "/"
                more = len(page) == page_size and at < len(ordered) and ordered[at].startswith(prefix)
            yield from page
            if not more:
                return
            start = page[-1][:-1] + "0"

    def delete(self, key: str) -> None:
        with self._lock:
            self._count("delete")
            if self._objects.pop(key, None) is not None:
                self._sorted = None

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        parts = []
        for part in read_parts(path, self.limits.part_size):
            parts.append(part)
            if progress:
                progress(len(part))
        with self._lock:
            self._count("upload_file")
            return self._write(key, tuple(parts))

    def download_files(self, gets: Sequence[FileGet]) -> builtins.list[str | Exception]:
        return download_each(self, gets)

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        with self._lock:
            self._count("download_file")
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound(key)
        if version is not None and obj.version != version:
            raise PreconditionFailed(f"{key} is at version {obj.version}, not {version}")
        step = self.limits.part_size
        with atomic_file(path) as tmp, tmp.open("wb") as out:
            for part in obj.parts:
                view = memoryview(part)  # slices of a view copy nothing: one part at a time, as on a cloud
                for start in range(0, len(view), step):
                    piece = view[start:start + step]
                    out.write(piece)
                    self.served.setdefault(key, []).append(len(piece))
                    if progress:
                        progress(len(piece))
        return obj.version

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        return ("PUT" if write else "GET"), f"memory://{self.bucket}/{key}?expires={expires}"

    def parts(self, key: str) -> builtins.list[int]:
        """The sizes of the parts an object arrived in (tests check that large files move in parts)."""
        with self._lock:
            return [len(p) for p in self._objects[key].parts]


class Clock:
    """A clock that moves only when told: scenario tests share one between MemoryStore and MemoryCompute and
    step it ("12:31"), so nothing sleeps and every run sees the same times."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def at(self, hhmm: str) -> datetime:
        """Move to HH:MM of the current day; a clock never runs backwards."""
        hour, minute = (int(p) for p in hhmm.split(":"))
        target = self.now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if target < self.now:
            raise ValueError(f"{hhmm} is before {self.now:%H:%M:%S}: a clock never runs backwards")
        self.now = target
        return target

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("a clock never runs backwards")
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class _Vm:
    instance: Instance  # as launched; its state is derived from the clock
    ended: datetime | None = None  # terminated, reclaimed or powered off at
    console: str = ""
    listed: Instance | None = None  # as last listed: a copy per state, not per listing (Instance is frozen)


class MemoryCompute:
    """In-memory Compute with EC2's and GCE's semantics, as the moto EC2 and the Compute fake enforce them.

    A VM is pending for `boot` seconds after its launch, then running; once terminated (by terminate, or by
    the cloud: reclaim) it is shutting-down for `shutdown` seconds, then terminated. list_managed shows only
    live VMs carrying the managed tag, as EC2's filtered DescribeInstances does; terminate touches only those
    and never a protected one. Capacity errors and refusals are scripted per (instance type, zone).
    With a deployment, launches carry its tag and list_managed and terminate see only VMs carrying it, as the
    adapters' filters do; scoped() gives another deployment's view of the same account.
    """

    def __init__(self, clock: Callable[[], datetime] | None = None, *, cloud: str = "aws",
                 region: str = "us-east-1", boot: float = 60, shutdown: float = 30,
                 deployment: str | None = None) -> None:
        self.cloud, self.region, self.deployment = cloud, region, deployment
        self._clock = clock or (lambda: datetime.now(UTC))
        self._boot, self._shutdown = timedelta(seconds=boot), timedelta(seconds=shutdown)
        self._vms: dict[str, _Vm] = {}
        self._lock = threading.Lock()
        # (instance type, zone, Spot only) -> what a launch there raises; None: any type or zone
        self._failures: dict[tuple[str | None, str | None, bool],
                             tuple[type[CapacityError | LaunchRejected], str]] = {}
        self.launches: builtins.list[LaunchRequest] = []  # every request that made VMs, in order
        self.refused: builtins.list[str] = []  # ids terminate would not touch (unmanaged, protected or gone)

    # ---- the Compute protocol -------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> builtins.list[Instance]:
        zone = request.zone or f"{self.region}a"
        with self._lock:
            itype = request.instance_type
            keys = [(t, z, spot) for t, z in ((itype, zone), (itype, None), (None, zone), (None, None))
                    for spot in (False, True) if request.spot or not spot]
            failure = next((self._failures[k] for k in keys if k in self._failures), None)
            if failure is not None:
                error, code = failure
                raise error(code, f"no {request.instance_type} in {zone}")
            tags = {**dict(request.labels), TAG_MANAGED: "true", TAG_JOB_ID: request.job_id,
                    TAG_ATTEMPT: str(request.attempt), TAG_OWNER: request.owner}  # ours win over labels
            tags.update({TAG_DEPLOYMENT: self.deployment} if self.deployment else {})
            made = [self._add(tags, rank=rank, zone=zone, spot=request.spot, instance_type=request.instance_type)
                    for rank in range(request.num_nodes)]
            self.launches.append(request)
            return made

    def list_managed(self) -> builtins.list[Instance]:
        return [i for i in self.instances(managed=True, live=True) if self._ours(i)]

    def _ours(self, inst: Instance) -> bool:
        return self.deployment is None or dict(inst.tags).get(TAG_DEPLOYMENT) == self.deployment

    def scoped(self, deployment: str) -> MemoryCompute:
        """Another deployment's adapter on the same account: the same VMs, clock and scripted failures."""
        view = copy.copy(self)
        view.deployment = deployment
        return view

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        with self._lock:
            now = self._clock()
            for iid in sorted(set(instance_ids)):
                vm = self._vms.get(iid)
                if (vm is None or not vm.instance.managed or not self._ours(vm.instance) or vm.instance.protected
                        or vm.ended is not None):
                    self.refused.append(iid)
                    continue
                vm.ended = now

    def console_output(self, instance_id: str) -> str:
        with self._lock:
            return self._vms[instance_id].console

    # ---- what the cloud and the VMs do on their own --------------------------------------------------
    def add(self, job_id: str | None = None, attempt: int | None = None, rank: int = 0, *, managed: bool = True,
            protected: bool = False, instance_type: str = "t3.micro", spot: bool = False,
            deployment: str | None = None) -> str:
        """A VM started outside the launcher (a leaked one, an old attempt's, another team's); returns its id.
        It carries this adapter's deployment tag unless another deployment is named."""
        tags = {TAG_MANAGED: "true" if managed else "false"} if managed or job_id else {}
        tags.update({TAG_DEPLOYMENT: d} if (d := deployment or self.deployment) else {})
        tags.update({TAG_JOB_ID: job_id} if job_id else {})
        tags.update({TAG_ATTEMPT: str(attempt)} if attempt is not None else {})
        with self._lock:
            return self._add(tags, rank=rank, zone=f"{self.region}a", spot=spot, instance_type=instance_type,
                             protected=protected).id

    def reclaim(self, instance_id: str) -> None:
        """The VM ends without anyone calling terminate: a Spot reclaim, a guest power-off, an uptime backstop."""
        with self._lock:
            vm = self._vms[instance_id]
            vm.ended = vm.ended or self._clock()

    def set_console(self, instance_id: str, text: str) -> None:
        with self._lock:
            self._vms[instance_id].console = text

    def fail(self, instance_type: str | None = None, zone: str | None = None, *,
             code: str = "InsufficientInstanceCapacity", rejected: bool = False, spot: bool = False) -> None:
        """Launches of this type in this zone (None: any) raise CapacityError(code), or LaunchRejected; with
        spot, only Spot launches do (on-demand capacity is there)."""
        with self._lock:
            self._failures[(instance_type, zone, spot)] = (LaunchRejected if rejected else CapacityError, code)

    def restore(self, instance_type: str | None = None, zone: str | None = None, *, spot: bool = False) -> None:
        with self._lock:
            self._failures.pop((instance_type, zone, spot), None)

    def state(self, instance_id: str) -> str:
        """The VM's state now: pending, running, shutting-down or terminated."""
        with self._lock:
            return self._state(self._vms[instance_id])

    def instances(self, *, managed: bool | None = None, live: bool = False, **tags: str) -> builtins.list[Instance]:
        """Every VM ever launched (live only: not shutting-down or terminated), filtered like DescribeInstances
        by the managed tag and by tags given as keyword arguments (job_id="train" means jobplane:job-id)."""
        wanted = {f"jobplane:{k.replace('_', '-')}": v for k, v in tags.items()}
        with self._lock:
            out = [self._listed(vm) for vm in self._vms.values()]
        return [i for i in out if (managed is None or i.managed == managed)
                and (not live or i.state in ("pending", "running"))
                and wanted.items() <= dict(i.tags).items()]

    def _listed(self, vm: _Vm) -> Instance:
        state = self._state(vm)
        if vm.listed is None or vm.listed.state != state:
            vm.listed = replace(vm.instance, state=state)
        return vm.listed

    def _state(self, vm: _Vm) -> str:
        now = self._clock()
        if vm.ended is not None:
            return "terminated" if now >= vm.ended + self._shutdown else "shutting-down"
        return "running" if now >= vm.instance.launched_at + self._boot else "pending"

    def _add(self, tags: dict[str, str], *, rank: int, zone: str, spot: bool, instance_type: str,
             protected: bool = False) -> Instance:
        number = len(self._vms) + 1
        attempt = tags.get(TAG_ATTEMPT, "")
        inst = Instance(id=f"i-{number:017x}", state="pending", launched_at=self._clock(),
                        managed=tags.get(TAG_MANAGED) == "true", job_id=tags.get(TAG_JOB_ID),
                        attempt=int(attempt) if attempt.isdigit() else None, rank=rank, spot=spot,
                        protected=protected, zone=zone, instance_type=instance_type,
                        private_ip=f"10.0.{number // 250}.{number % 250 + 4}", tags=tuple(sorted(tags.items())))
        self._vms[inst.id] = _Vm(inst)
        return inst


class MemorySecrets:
    """base.SecretStore in memory, with the time each was set (the clouds' stores answer the same)."""

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._values: dict[tuple[str, str], tuple[bytes, datetime]] = {}
        self._now = now
        self._lock = threading.Lock()

    def put(self, owner: str, name: str, value: bytes) -> None:
        with self._lock:
            self._values[(owner, name)] = (bytes(value), self._now())

    def get(self, owner: str, name: str) -> bytes:
        with self._lock:
            if (owner, name) not in self._values:
                raise SecretMissing(name)
            return self._values[(owner, name)][0]

    def list(self, owner: str | None = None) -> builtins.list[SecretInfo]:
        with self._lock:
            return [SecretInfo(o, n, at) for (o, n), (_, at) in sorted(self._values.items())
                    if owner is None or o == owner]

    def delete(self, owner: str, name: str) -> bool:
        with self._lock:
            return self._values.pop((owner, name), None) is not None
