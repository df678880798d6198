"""ObjectStore over Google Cloud Storage; the version token is the object's generation.

Files move in chunks of TransferLimits.part_size: uploads larger than 8 MiB as resumable uploads (one chunk
in memory at a time, each retried and resumed from what GCS acknowledged), downloads larger than one part as
ranged GETs of DOWNLOAD_PIECE bytes in parallel threads (google.cloud.storage.transfer_manager), pinned to one
generation. A download of up to DOWNLOAD_PIECE bytes (a file or a range) is read from the socket in one call
(single_shot_download): google's loop otherwise reads 8 KiB at a time, and with other threads transferring,
each read hands the GIL over (about 100 context switches for a 64 KiB file, twice its CPU, and a ranged
download at 4.7 CPU s per GiB). A thread so holds at most DOWNLOAD_PIECE bytes.

google.cloud.storage is slow to import (a large share of the ~1 s the GCP libraries cost), so it is
imported in GcsStore.__init__ only: code that never builds a GcsStore never pays for it.
"""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from jobplane.clouds.base import (
    AccessDenied,
    Blob,
    FileGet,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    Progress,
    StoreError,
    TransferLimits,
    download_each,
)
from jobplane.clouds.streams import atomic_file

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import storage

# A read is two requests (metadata, then the bytes pinned to that generation), and a write landing in
# between means reading again. On GCS (about one write per second per object) that is rare; with 16
# threads hammering one object in-process, over half of all reads race a write and streaks of 20 occur,
# so retry until a deadline rather than a count, pausing briefly (jittered) to spread the readers out.
_READ_DEADLINE_S = 30.0
_READ_PAUSE_S = 0.02
_CHUNK_UNIT = 256 << 10  # resumable-upload chunks must be multiples of this
DOWNLOAD_PIECE = 4 << 20  # on the GCS fake: 1 GiB down at 2 MiB pieces 761 MB/s, 4 MiB 842-980, 16 MiB 739


def _utc(ts: datetime | None) -> datetime:
    if ts is None:  # only if a server omitted `updated`; never on real GCS
        return datetime.fromtimestamp(0, UTC)
    return ts.astimezone(UTC) if ts.tzinfo else ts.replace(tzinfo=UTC)


def _check_served(key: str, blob: Any, generation: int) -> None:
    """Refuse what a read pinned with ifGenerationMatch returned for another generation. GCS itself answers such a
    read 412, so there this never fires; an emulator that ignores the precondition on reads (fake-gcs-server)
    serves the live object instead, and says which in x-goog-generation or the metadata."""
    served = blob.generation
    if served is not None and int(served) != generation:
        raise PreconditionFailed(f"{key}: generation {generation} asked for, {served} served")


def access_token_credentials(token: str) -> Credentials:
    """Credentials that send this OAuth access token as it is (`gcloud auth print-access-token`'s: never refreshed,
    so it serves until it expires, an hour on Google)."""
    from google.oauth2.credentials import Credentials as TokenCredentials

    return TokenCredentials(token)  # type: ignore[no-untyped-call]


class GcsStore:
    """One bucket. With STORAGE_EMULATOR_HOST set, the default client talks to that emulator anonymously.
    project: the client's (GOOGLE_CLOUD_PROJECT, from Settings); objects in a bucket do not depend on it.
    credentials: the default client's instead of Application Default Credentials (an agent's are its job's,
    jobplane.clouds.gcp_vend), sent to an emulator too."""

    def __init__(self, bucket: str, client: storage.Client | None = None, limits: TransferLimits | None = None,
                 *, project: str | None = None, credentials: Credentials | None = None) -> None:
        from google.api_core import exceptions
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        limits = limits or TransferLimits()
        part = max(_CHUNK_UNIT, limits.part_size // _CHUNK_UNIT * _CHUNK_UNIT)
        self.limits = TransferLimits(part, limits.concurrency)

        if client is None:
            client = storage.Client(project=project or "jobplane-local", credentials=credentials)
        self._client: Any = client
        self._bucket: Any = client.bucket(bucket)
        self.bucket = bucket  # the name: the VM's startup script reads the registry from it
        self._api_errors: Any = exceptions
        # DEFAULT_RETRY retries 429/5xx/connection errors, never a 412, so it cannot turn a lost
        # precondition into a success. Retrying a conditional write whose response was lost may answer
        # 412 for our own write; that surfaces as PreconditionFailed and callers re-read, as on any 412.
        # Retrying an unconditional put is safe too: it is concurrent with any write it overtakes.
        self._retry: Any = DEFAULT_RETRY

    @contextmanager
    def _mapped(self, key: str) -> Iterator[None]:
        """Translate google.api_core errors into the store's own."""
        try:
            yield
        except self._api_errors.PreconditionFailed as err:
            raise PreconditionFailed(f"{key}: generation precondition failed") from err
        except self._api_errors.NotFound as err:
            raise NotFound(key) from err
        except self._api_errors.Forbidden as err:  # IAM's refusal: another team's keys, or the control plane's
            raise AccessDenied(f"access denied to {key}") from err

    def get(self, key: str) -> Blob:
        deadline = time.monotonic() + _READ_DEADLINE_S
        while True:
            with self._mapped(key):
                meta = self._bucket.get_blob(key)  # None when missing
            if meta is None:
                raise NotFound(key)
            generation = int(meta.generation)
            try:
                # Pin the download to the generation whose metadata we hold, so bytes, version and
                # last_modified all describe the same write.
                reader = self._bucket.blob(key)
                data = reader.download_as_bytes(if_generation_match=generation)
                _check_served(key, reader, generation)
            except (self._api_errors.PreconditionFailed, PreconditionFailed):
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"{key} was rewritten during every read for {_READ_DEADLINE_S}s"
                    ) from None
                time.sleep(random.uniform(0, _READ_PAUSE_S))
                continue
            except self._api_errors.NotFound as err:
                raise NotFound(key) from err
            except self._api_errors.Forbidden as err:
                raise AccessDenied(f"access denied to {key}") from err
            return Blob(data=cast(bytes, data), version=str(generation), last_modified=_utc(meta.updated))

    def _upload(self, key: str, data: bytes, content_type: str, if_generation_match: int | None,
                tags: Mapping[str, str] | None = None) -> str:
        blob = self._bucket.blob(key)
        if tags:
            blob.metadata = dict(tags)
        with self._mapped(key):
            blob.upload_from_string(
                data, content_type=content_type, if_generation_match=if_generation_match, retry=self._retry
            )
        return str(blob.generation)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._upload(key, data, content_type, None)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        return self._upload(key, data, content_type, 0, tags)  # generation 0 = "no live object"

    def put_if_match(
        self, key: str, data: bytes, version: str, content_type: str = "application/json"
    ) -> str:
        try:
            generation = int(version)
        except ValueError:
            raise PreconditionFailed(f"{key}: {version!r} is not a GCS generation") from None
        return self._upload(key, data, content_type, generation)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        # list_blobs pages lazily: the next page is fetched only when the caller iterates that far.
        pages = self._client.list_blobs(
            self._bucket, prefix=prefix, page_size=page_size,
            fields="items(name,updated,size,generation),nextPageToken",
        )
        with self._mapped(prefix):
            for blob in pages:
                yield ObjectInfo(key=blob.name, last_modified=_utc(blob.updated), size=int(blob.size or 0),
                                 version=str(blob.generation or ""))

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        listed = self._client.list_blobs(self._bucket, prefix=prefix, delimiter="/", page_size=page_size,
                                         fields="prefixes,nextPageToken")
        with self._mapped(prefix):
            for page in listed.pages:
                yield from sorted(page.prefixes)  # a page's prefixes come as a set

    def delete(self, key: str) -> None:
        try:
            with self._mapped(key):
                self._bucket.blob(key).delete(retry=self._retry)
        except NotFound:
            pass  # already gone, possibly by our own retried delete

    vm_auth = "gce"  # a VM calls with its service account's token from the metadata server

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(method, JSON API URL) with which a VM reads or writes this key using only the standard library and
        its own token; `expires` does not apply (nothing is signed)."""
        base = str(self._client.api_endpoint).rstrip("/")
        base = base if "://" in base else f"http://{base}"  # STORAGE_EMULATOR_HOST may omit the scheme
        bucket, name = quote(self._bucket.name, safe=""), quote(key, safe="")
        if write:
            return "POST", f"{base}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        return "GET", f"{base}/storage/v1/b/{bucket}/o/{name}?alt=media"

    # ---- files -------------------------------------------------------------------------------------------
    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        blob = self._bucket.blob(key, chunk_size=self.limits.part_size)
        size = path.stat().st_size
        with self._mapped(key):
            if size <= self.limits.part_size:  # read once: a file rewritten meanwhile cannot end the body early
                body = path.read_bytes()
                blob.upload_from_string(body, content_type=content_type, retry=self._retry)
                size = len(body)
            else:
                blob.upload_from_filename(str(path), content_type=content_type, retry=self._retry)
        if progress:
            progress(size)  # the client reports no progress; the CLI's bar jumps to the end
        return str(blob.generation)

    def download_files(self, gets: Sequence[FileGet]) -> builtins.list[str | Exception]:
        return download_each(self, gets)

    def _download_whole(self, blob: Any, tmp: Path, size: int, pinned: Mapping[str, int]) -> None:
        """One GET of a file of one part, read from the socket in one call where it fits in a piece."""
        blob.download_to_filename(str(tmp), retry=self._retry, single_shot_download=size <= DOWNLOAD_PIECE, **pinned)

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        from google.cloud.storage import transfer_manager

        pinned = {"if_generation_match": int(version)} if version else {}
        with self._mapped(key), atomic_file(path) as tmp:
            if size is not None and size <= self.limits.part_size:
                blob = self._bucket.blob(key)  # one GET; its headers carry the generation
                self._download_whole(blob, tmp, size, pinned)
                if version:
                    _check_served(key, blob, int(version))
            else:
                blob = self._bucket.get_blob(key, **pinned)  # size and generation
                if blob is None:
                    raise NotFound(key)
                if version:
                    _check_served(key, blob, int(version))
                # every ranged GET is pinned to this generation: a rewrite midway fails with 412
                pinned = {"if_generation_match": int(blob.generation)}
                if (whole := int(blob.size or 0)) <= self.limits.part_size:
                    self._download_whole(blob, tmp, whole, pinned)
                else:
                    transfer_manager.download_chunks_concurrently(
                        blob, str(tmp), chunk_size=min(self.limits.part_size, DOWNLOAD_PIECE),
                        worker_type=transfer_manager.THREAD, max_workers=self.limits.concurrency,
                        download_kwargs={**pinned, "retry": self._retry, "single_shot_download": True})
        if progress:
            progress(path.stat().st_size)
        return str(blob.generation)
