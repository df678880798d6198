"""The small protocols the control plane needs from a cloud, and the errors they raise.

Everything above this layer (registry, decisions, agent) is written against these, so the same code runs
on S3, GCS and the in-memory store used by pure unit tests.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from jobplane.model.secrets import SecretInfo


class StoreError(Exception):
    """Base class for object-store errors the control plane handles."""


class NotFound(StoreError):
    """The key does not exist."""


class AccessDenied(StoreError):
    """The caller's credentials may not do this to the key (S3's 403 AccessDenied, GCS's 403): another team's keys,
    or the control plane's."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the object exists (create-only) or changed since it was read (CAS)."""


class CredentialsRefused(StoreError):
    """The credential vending function will not give this VM its job's credentials (the attempt is over, or the
    VM is not one of it): the agent's storage access has ended, and retrying cannot bring it back."""


class ProofRejected(Exception):
    """A VM's identity proof is malformed, made for something else, or its signature is not STS's to accept."""


class VendUnavailable(Exception):
    """STS, EC2 or the vending function did not answer: a transient failure, not a verdict on the caller."""


@dataclass(frozen=True)
class Scope:
    """The keys (relative to the bucket, root included) a job's credentials reach. Everything under
    `read_write` prefixes and the `read_write_objects`; to read, everything under `read_only` prefixes and the
    `read_only_objects` (each exactly that object: never a prefix, never listed)."""

    bucket: str
    read_write: tuple[str, ...]
    read_write_objects: tuple[str, ...]
    read_only: tuple[str, ...]
    read_only_objects: tuple[str, ...] = ()
    # the job record's folder (jobs/<id>/), which holds some of the keys above: a cloud whose job role already grants
    # only an agent's kinds of key in it (AWS's, vending.aws_iam.AGENT_WRITE) may name this folder whole in a session
    # policy, keeping it under the size limit; one with no such role (GCP's boundary) names each key
    record_folder: str = ""
    # the owner's secrets the job reads (model.secrets names, spec order): AWS's session policy names each
    # (clouds/aws_secrets.resource_arn); GCP's vend function reads them for the job (vending/gcp.py)
    secret_owner: str = ""
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObjectInfo:
    """One listing entry: everything a listing returns without a GET per key."""

    key: str
    last_modified: datetime
    size: int
    version: str = ""  # S3 ETag / GCS generation, the token Blob.version and download_file return


@dataclass(frozen=True)
class Blob:
    """An object's bytes and the version token to compare-and-swap against (S3 ETag, GCS generation)."""

    data: bytes
    version: str
    last_modified: datetime


@dataclass(frozen=True)
class TransferLimits:
    """How upload_file / download_file move a file: files up to part_size go in one request, larger ones in
    parts of part_size with at most `concurrency` parts in flight, so a transfer holds about
    part_size x concurrency bytes in memory whatever the file's size. Stores may raise part_size to their
    cloud's minimum (S3: 5 MiB parts; GCS: multiples of 256 KiB, and uploads up to 8 MiB go in one request).
    `files`: whole files a batch moves at once (0: twice `concurrency`); a store whose requests cost little CPU
    raises it, since small files are bound by each request's round trip."""

    part_size: int = 16 << 20
    concurrency: int = 8
    files: int = 0

    def __post_init__(self) -> None:
        if self.part_size <= 0 or self.concurrency <= 0 or self.files < 0:
            raise ValueError(f"part_size and concurrency must be positive and files not negative, got {self}")

    @property
    def files_in_flight(self) -> int:
        return self.files or max(4, 2 * self.concurrency)


Progress = Callable[[int], None]  # called with the bytes moved since its previous call


class ObjectStore(Protocol):
    """Object storage with the conditional writes the registry's single-writer rule rests on, and streaming
    file transfers for data of any size (code bundles, inputs, checkpoints, artifacts)."""

    limits: TransferLimits  # part size and parallelism of upload_file / download_file

    def get(self, key: str) -> Blob:
        """Return the object, or raise NotFound."""
        ...

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Write unconditionally; return the new version token."""
        ...

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        """Create only: raise PreconditionFailed if the key exists.

        tags label the object for lifecycle rules (S3 object tags; GCS custom metadata)."""
        ...

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        """Compare-and-swap: raise PreconditionFailed unless the current version is `version`."""
        ...

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        """Yield every key under prefix in key order, fetching one page at a time."""
        ...

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        """Yield each folder right under prefix (a key's start up to its next '/' after prefix) once, in key order,
        from a delimiter listing: a page holds page_size folders however many keys each holds."""
        ...

    def delete(self, key: str) -> None:
        """Delete the key; deleting a missing key is not an error."""
        ...

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        """Write the file at path to key (unconditionally), streaming it in parts with the SDK's retries;
        return the new version token."""
        ...

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        """Write the object to path, streaming it in parts, and return the version written.

        The file appears at path only once complete (written beside it, then renamed). With `version`, raise
        PreconditionFailed unless that is the object's version, before and during the transfer, leaving path
        untouched; NotFound if the key is missing. `size` (from a listing) saves a metadata request."""
        ...

    def download_files(self, gets: Sequence[FileGet]) -> builtins.list[str | Exception]:
        """download_file for each, limits.files_in_flight at once; per file, in order, its version or its error."""
        ...


class FileGet(NamedTuple):
    """One file of a download_files batch: download_file's arguments."""

    key: str
    path: Path
    version: str | None = None
    size: int | None = None


def download_each(store: ObjectStore, gets: Sequence[FileGet]) -> list[str | Exception]:
    """download_files where every file costs a thread: store.download_file on limits.files_in_flight threads."""
    def one(get: FileGet) -> str | Exception:
        try:
            return store.download_file(get.key, get.path, version=get.version, size=get.size)
        except Exception as exc:
            return exc

    if len(gets) <= 1:  # no pool for one file
        return [one(get) for get in gets]
    with ThreadPoolExecutor(min(len(gets), store.limits.files_in_flight), thread_name_prefix="transfer") as pool:
        return list(pool.map(one, gets))


@runtime_checkable
class VmUrls(Protocol):
    """A store whose objects a VM can read and write with plain HTTP (the bootstrap has no SDK).

    vm_auth None: the URLs are presigned; "gce": the VM adds its service account's token to each request."""

    vm_auth: str | None

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(HTTP method, URL) to read (GET) or write this key, usable for `expires` seconds."""
        ...


# ---- compute -------------------------------------------------------------------------------------------
# Ownership tags (EC2 tag keys; GCE labels replace ':' with '-'). Nothing without MANAGED=true is touched.
TAG_MANAGED = "jobplane:managed"
TAG_JOB_ID = "jobplane:job-id"
TAG_ATTEMPT = "jobplane:attempt"
TAG_RANK = "jobplane:rank"
TAG_OWNER = "jobplane:owner"
# The registry (bucket and root) that launched the VM: one deployment lists, checks and terminates only its own,
# so two deployments in one account and region never touch each other's VMs (IAM enforces it again on AWS).
TAG_DEPLOYMENT = "jobplane:deployment"
# Object tag on log chunks: S3 lifecycle rules can filter on tags but not on a key pattern like jobs/*/logs/.
LOG_OBJECT_TAG = ("jobplane:object", "log")


@dataclass(frozen=True)
class Instance:
    """A VM as the reconcilers see it, normalized across clouds.

    state is one of: pending, running, stopping, stopped, terminated (GCE's PROVISIONING/STAGING map to
    pending, TERMINATED/SUSPENDED to stopped, a deleted VM to terminated).
    """

    id: str
    state: str
    launched_at: datetime
    managed: bool
    job_id: str | None = None
    attempt: int | None = None
    rank: int | None = None
    spot: bool = False
    protected: bool = False  # termination protection / deletion protection: never terminated by us
    zone: str | None = None
    instance_type: str | None = None
    private_ip: str | None = None
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt of one job in one zone with one instance type: num_nodes VMs, all or nothing."""

    job_id: str
    attempt: int
    num_nodes: int
    instance_type: str
    zone: str | None
    image: str
    spot: bool
    user_data: str
    max_runtime: int  # seconds a VM may live (policy.vm_lifetime): GCE enforces it natively, EC2 by the bootstrap
    disk_gb: int
    owner: str
    labels: tuple[tuple[str, str], ...] = ()
    name: str | None = None
    accelerator: tuple[str, int] | None = None  # GCE accelerator type and count to attach (N1 types); EC2: none
    max_price: float | None = None  # EC2 Spot: USD an instance-hour the VMs may bill at most (the spec's max_price)


class CapacityError(Exception):
    """The cloud had no room for this (zone, type): try the next one, then wait."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class LaunchRejected(Exception):
    """The cloud refused the request for a reason retrying elsewhere will not fix (bad image, quota...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Compute(Protocol):
    """The VM operations the control plane needs; one adapter per cloud."""

    cloud: str  # "aws" | "gcp", as a spec's `cloud` says it
    region: str  # the one region this deployment launches in

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start num_nodes VMs (all or nothing), ordered by rank; raise CapacityError or LaunchRejected."""
        ...

    def list_managed(self) -> list[Instance]:
        """Every non-terminated VM carrying the managed tag/label (paginated, filtered server-side)."""
        ...

    def terminate(self, instance_ids: list[str]) -> None:
        """Terminate these VMs. Callers pass only managed, unprotected instances; adapters re-check."""
        ...

    def console_output(self, instance_id: str) -> str:
        """What the VM printed to its console (EC2 GetConsoleOutput, GCE serial port 1), newest last."""
        ...


@runtime_checkable
class SpotPrices(Protocol):
    """A cloud that can say what a Spot VM costs right now (EC2: DescribeSpotPriceHistory)."""

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """USD per hour of a Linux Spot VM of this type in this zone now, or None if the cloud has no price."""
        ...


@dataclass(frozen=True)
class Notice:
    """A message for people: a subject line, a text for e-mail, and data for programs (flat JSON values)."""

    subject: str
    text: str
    data: Mapping[str, object]


class Notifier(Protocol):
    """Where job notifications go: an SNS topic (AWS), a Pub/Sub topic (GCP), the local cloud's console."""

    def publish(self, notice: Notice) -> None:
        """Publish once; raise on failure (the caller logs and counts it, and never retries)."""
        ...


class Metadata(Protocol):
    """What the agent asks the VM's metadata service (EC2 IMDSv2, GCE metadata server)."""

    def instance_id(self) -> str: ...

    def rank(self) -> int: ...

    def tag(self, key: str) -> str | None:
        """An ownership tag of this VM (EC2 instance tags in IMDS, GCE labels/attributes)."""
        ...

    def preemption_notice(self) -> dict[str, str] | None:
        """The Spot interruption notice ({"action", "time"}) once the cloud sends one, else None."""
        ...


class SecretStore(Protocol):
    """A deployment's secrets, per owner (clouds/aws_secrets.py, clouds/gcp_secrets.py, memory.MemorySecrets).
    Values are bytes; `get` raises model.secrets.SecretMissing for none; `list` never returns a value."""

    def put(self, owner: str, name: str, value: bytes) -> None: ...

    def get(self, owner: str, name: str) -> bytes: ...

    def list(self, owner: str | None = None) -> builtins.list[SecretInfo]: ...

    def delete(self, owner: str, name: str) -> bool: ...
