"""ObjectStore over S3 (boto3): conditional writes with If-None-Match / If-Match, and files moved in parts,
in parallel, by this module's own multipart upload and ranged download.

Files up to one part go in a single PutObject / GetObject, whose response carries the ETag. Larger ones are
cut into parts of TransferLimits.part_size, moved by one thread pool per store (shared by every call, so the
concurrency limit holds across files): each download thread reads its range from the socket straight into
its own buffer and writes it at its offset in the file (no writer thread, no queue of small pieces under the
GIL), and each upload thread reads its part from the file at its offset. Memory stays at about one part per
upload thread and one read buffer per download thread, whatever the file's size; files of one part, sent whole,
hold at most part_size x concurrency bytes at once between them (ByteBudget).

The agent's stores (compiled=True) move files of one part through awscrt instead (jobplane.clouds.s3_crt),
where botocore's per-request Python (about 2 ms of CPU) would bound many small files; bigger files keep this
module's parts.

Checksums: botocore computes none it is not required to (by default it adds a CRC32 to every request and
checks one on every response, CPU spent on every small file). Every body sent (a record, a file, a part)
carries Content-MD5, which S3 checks against the bytes it received and the request's signature covers, so
payloads go unsigned, over plain HTTP too (no SHA-256 of each body besides its MD5); a multipart upload's
ETag, taken from its completion (no HEAD), must be the MD5 of the parts' MD5s wherever S3 names parts by their
MD5 (everywhere but under SSE-KMS). A download is pinned to the ETag it started from (If-Match on every range),
and every range must deliver exactly the bytes it asked for.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from http.client import HTTPException
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlencode

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.utils import parse_timestamp

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
from jobplane.clouds.streams import PARTIAL_SUFFIX, atomic_file

if TYPE_CHECKING:
    from jobplane.clouds.s3_crt import CrtObjects

# 409 ConditionalRequestConflict: a concurrent conditional write is in flight; the caller re-reads and
# retries exactly as for 412, so both map to PreconditionFailed.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden"}  # IAM's refusal: another team's keys, or the control plane's

# s3v4 and virtual-hosted addressing: presigned URLs (vm_request) name the bucket's own region
# (bucket.s3.<region>.amazonaws.com), as SigV4 needs; with the global endpoint a VM outside us-east-1 would
# be redirected. Requests are SigV4 anyway, and an IP endpoint (moto) still gets path-style URLs.
# Unsigned payloads: botocore skips the body's SHA-256 over HTTPS already; over plain HTTP (a local or private
# endpoint) it would cost 0.6 CPU s per GiB uploaded, besides the signed Content-MD5 that S3 checks.
RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8}, signature_version="s3v4",
                 s3={"addressing_style": "virtual", "payload_signing_enabled": False},
                 request_checksum_calculation="when_required", response_checksum_validation="when_required",
                 max_pool_connections=64)  # a transfer's parallel parts and many small files, plus the agent's calls
MIN_PART = 5 << 20  # S3 refuses smaller parts (except the last)
_READ = 1 << 20  # bytes a download thread reads from the socket at a time, into its own buffer
T = TypeVar("T")
FILES_COMPILED = 64  # files in flight on the compiled path: each costs a connection, not a Python thread's CPU
_PART_TRIES = 5  # a part whose body broke off midway is asked for again (botocore retries only the request)


def s3_client(region: str | None = None, session: Any = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (moto server, local cloud) with adaptive retries; session: a boto3
    Session whose credentials to use (the job's vended ones), else the default chain's."""
    client = (session or boto3).client("s3", region_name=region, config=RETRIES)
    client._endpoint._response_parser_factory.set_parser_defaults(timestamp_parser=_timestamp)
    return client


def _timestamp(value: Any) -> datetime:
    """botocore's timestamp parsing, without dateutil for what S3 sends most: ISO 8601 with its zone (every
    listed object's LastModified). dateutil spends about half of a listing's CPU on them."""
    if isinstance(value, str) and "T" in value:
        with suppress(ValueError):
            if (parsed := datetime.fromisoformat(value)).tzinfo is not None:
                return parsed
    return cast(datetime, parse_timestamp(value))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mapped(exc: ClientError, key: str) -> Exception:
    code = _code(exc)
    if code in _LOST_RACE:
        return PreconditionFailed(f"{key}: {code}")
    if code in _MISSING:
        return NotFound(key)
    if code in _DENIED:
        return AccessDenied(f"access denied to {key}")
    return cast(Exception, exc)


def _md5(data: bytes | memoryview) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()  # releases the GIL on large buffers


def _content_md5(digest: bytes) -> str:
    """An MD5 digest as the Content-MD5 header carries it."""
    return base64.b64encode(digest).decode()


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives an object completed from parts with these MD5s: the MD5 of their concatenation, -N."""
    return f'"{hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"'


class S3Store:
    def __init__(self, bucket: str, client: Any = None, limits: TransferLimits | None = None, *,
                 compiled: bool = False) -> None:
        """compiled: files of one part go through awscrt's S3 client where it can be imported (the agent's
        stores, jobplane.clouds.s3_crt), FILES_COMPILED of them at once; else through botocore."""
        self.bucket = bucket
        self.client = client or s3_client()
        limits = limits or TransferLimits()
        part_size = max(limits.part_size, MIN_PART)
        self._fast = _compiled_path(bucket, self.client, part_size) if compiled else None
        self.limits = TransferLimits(part_size, limits.concurrency,
                                     limits.files or (FILES_COMPILED if self._fast else 0))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # one-request uploads hold their file's bytes: at most as many as a multipart upload's parts in flight
        self._bodies = ByteBudget(self.limits.part_size * self.limits.concurrency)

    @property
    def compiled(self) -> bool:
        """Whether files of one part go through awscrt."""
        return self._fast is not None

    def get(self, key: str) -> Blob:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _MISSING | _DENIED:
                raise _mapped(exc, key) from None
            raise
        return Blob(data=resp["Body"].read(), version=str(resp["ETag"]),
                    last_modified=resp["LastModified"].astimezone(UTC))

    def _put(self, key: str, data: bytes, content_type: str, **cond: str) -> str:
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type,
                                          ContentMD5=_content_md5(_md5(data)), **cond)
        except ClientError as exc:
            raise _mapped(exc, key) from None  # NotFound only for If-Match on a missing key
        return str(resp["ETag"])

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        extra = {"Tagging": urlencode(dict(tags))} if tags else {}
        return self._put(key, data, content_type, IfNoneMatch="*", **extra)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        return self._put(key, data, content_type, IfMatch=version)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": page_size}
        )
        for page in pages:
            for obj in page.get("Contents", []):
                yield ObjectInfo(key=obj["Key"], last_modified=obj["LastModified"].astimezone(UTC),
                                 size=int(obj["Size"]), version=str(obj.get("ETag", "")))

    def folders(self, prefix: str, page_size: int = 1000) -> Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, Delimiter="/", PaginationConfig={"PageSize": page_size}
        )
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                yield str(common["Prefix"])

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            raise _mapped(exc, key) from None

    vm_auth = None  # the URLs carry their own signature

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(method, presigned URL) with which a VM without credentials or SDK reads or writes this key."""
        url = self.client.generate_presigned_url("put_object" if write else "get_object",
                                                 Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires)
        return ("PUT" if write else "GET"), str(url)

    # ---- files -------------------------------------------------------------------------------------------
    def _parts(self, size: int, part: Callable[[int, int], T]) -> builtins.list[T]:
        """part(offset, length) for every part of a file of `size` bytes on the store's pool, in order; on the
        first failure the parts not yet started are dropped and that failure is raised."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.limits.concurrency, thread_name_prefix="s3-part")
            pool = self._pool
        step = self.limits.part_size
        futures: builtins.list[Future[T]] = [pool.submit(part, offset, min(step, size - offset))
                                      for offset in range(0, size, step)]
        try:
            return [future.result() for future in futures]
        finally:  # on a failure: drop the parts not started, and let the running ones end before the file closes
            for future in futures:
                future.cancel()
            wait(futures)

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        size = path.stat().st_size
        try:
            if size <= self.limits.part_size:
                # read once, sent as bytes: a file rewritten in place meanwhile (torch.save on a checkpoint) would
                # send fewer bytes than the Content-Length taken before, and S3 would wait for the rest until a timeout
                with self._bodies.hold(size):
                    body = path.read_bytes()
                    md5 = _content_md5(_md5(body))
                    if self._fast:
                        etag = self._fast.put(key, body, content_type, md5)
                    else:
                        etag = str(self.client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                                          ContentType=content_type, ContentMD5=md5)["ETag"])
                if progress:
                    progress(len(body))
                return etag
            return self._upload_parts(key, path, size, content_type, progress)
        except ClientError as exc:
            raise _mapped(exc, key) from None

    def _upload_parts(self, key: str, path: Path, size: int, content_type: str, progress: Progress | None) -> str:
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key, ContentType=content_type)
        upload_id = upload["UploadId"]
        fd = os.open(path, os.O_RDONLY)
        step = self.limits.part_size

        def part(offset: int, length: int) -> tuple[bytes, str]:
            data = os.pread(fd, length, offset)  # exactly this part's bytes, or fewer if the file shrank
            if len(data) != length:
                raise StoreError(f"{path} changed size during its upload")
            digest = _md5(data)
            resp = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                           PartNumber=offset // step + 1, Body=data,
                                           ContentMD5=_content_md5(digest))
            if progress:
                progress(length)
            return digest, str(resp["ETag"])

        try:
            done = self._parts(size, part)
            resp = self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, (_, etag) in enumerate(done, 1)]})
        except BaseException:
            with suppress(ClientError):  # the bucket's lifecycle rule removes what an abort could not
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        finally:
            os.close(fd)
        etag = str(resp["ETag"])
        # where the store names each part by its MD5 (not under SSE-KMS), the object must be named by those parts
        named_by_md5 = all(part_etag.strip('"') == digest.hex() for digest, part_etag in done)
        if named_by_md5 and etag != (expected := multipart_etag([digest for digest, _ in done])):
            raise StoreError(f"{key}: S3 completed the upload as {etag}, the parts sent make {expected}")
        return etag

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        try:
            if size is None:
                head = self.client.head_object(Bucket=self.bucket, Key=key, **_pinned(version))
                size, version = int(head["ContentLength"]), str(head["ETag"])
            if size <= self.limits.part_size:
                return self._get_whole(key, path, version, progress)
            return self._get_parts(key, path, size, version, progress)
        except ClientError as exc:
            raise _mapped(exc, key) from None

    def download_files(self, gets: Sequence[FileGet]) -> builtins.list[str | Exception]:
        """On the compiled path, the files of one part whose size is known go in one batch of requests with no
        thread waiting on each (a file lands under a temporary name beside its path, renamed once whole); the
        others, and every file without that path, as download_file moves them."""
        if self._fast is None:
            return download_each(self, gets)
        one_part = [get.size is not None and get.size <= self.limits.part_size for get in gets]
        whole = [n for n, fits in enumerate(one_part) if fits]
        rest = [n for n, fits in enumerate(one_part) if not fits]
        out: builtins.list[str | Exception] = [StoreError("not attempted")] * len(gets)
        for n, outcome in zip(rest, download_each(self, [gets[n] for n in rest]), strict=True):
            out[n] = outcome
        if not whole:
            return out
        batch = secrets.token_hex(4)
        temps = [gets[n].path.with_name(f".{gets[n].path.name}.{batch}-{n}{PARTIAL_SUFFIX}") for n in whole]
        for folder in {temp.parent for temp in temps}:
            folder.mkdir(parents=True, exist_ok=True)
        try:
            outcomes = self._fast.get_many([(gets[n].key, temp, gets[n].version) for n, temp in zip(whole, temps,
                                            strict=True)], self.limits.files_in_flight)
            for n, temp, outcome in zip(whole, temps, outcomes, strict=True):
                if isinstance(outcome, str):
                    os.replace(temp, gets[n].path)
                out[n] = outcome
        finally:
            for temp in temps:  # what failed, or was left when this batch was interrupted
                with suppress(FileNotFoundError):
                    os.unlink(temp)
        return out

    def _get_whole(self, key: str, path: Path, version: str | None, progress: Progress | None) -> str:
        if self._fast:
            with atomic_file(path) as tmp:
                etag = self._fast.get(key, tmp, version)
                if progress:
                    progress(tmp.stat().st_size)
            return etag
        resp = self.client.get_object(Bucket=self.bucket, Key=key, **_pinned(version))
        with atomic_file(path) as tmp, tmp.open("wb") as out:
            for chunk in resp["Body"].iter_chunks(_READ):
                out.write(chunk)
                if progress:
                    progress(len(chunk))
        return str(resp["ETag"])

    def _get_parts(self, key: str, path: Path, size: int, version: str | None, progress: Progress | None) -> str:
        if version is None:  # every range must come from one version of the object, and its size
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            size, version = int(head["ContentLength"]), str(head["ETag"])
        with atomic_file(path) as tmp:
            fd = os.open(tmp, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
                self._parts(size, lambda offset, length: self._get_range(key, version, fd, offset, length, progress))
            finally:
                os.close(fd)
        return version

    def _get_range(self, key: str, version: str, fd: int, offset: int, length: int,
                   progress: Progress | None) -> None:
        buf = memoryview(bytearray(min(_READ, length)))
        done = 0
        for attempt in range(1, _PART_TRIES + 1):
            resp = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=version,
                                          Range=f"bytes={offset + done}-{offset + length - 1}")
            # http.client's response under urllib3's: its readinto fills our buffer straight from the socket
            stream = resp["Body"]._raw_stream
            try:
                while done < length:
                    n = stream._fp.readinto(buf[:min(len(buf), length - done)])
                    if not n:
                        break
                    os.pwrite(fd, buf[:n], offset + done)
                    done += n
                    if progress:
                        progress(n)
            except (OSError, HTTPException) as exc:  # the connection broke off: ask again for what is missing
                stream.close()
                if attempt == _PART_TRIES:
                    raise StoreError(f"{key}: bytes {offset + done}-{offset + length - 1}: {exc}") from exc
                continue
            if done == length:
                stream.release_conn()
                return
            stream.close()
        raise StoreError(f"{key}: the range at {offset} ended {length - done} bytes short {_PART_TRIES} times")


def _compiled_path(bucket: str, client: Any, part_size: int) -> CrtObjects | None:
    try:
        from jobplane.clouds.s3_crt import CrtObjects
    except ImportError:  # a VM without awscrt: botocore moves every file
        return None
    return CrtObjects.of(bucket, client, part_size)


class ByteBudget:
    """At most `limit` bytes held at once across threads; one request larger than the limit waits until it is
    alone (so it still goes)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._changed = threading.Condition()

    @contextmanager
    def hold(self, size: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self.held == 0 or self.held + size <= self.limit)
            self.held += size
        try:
            yield
        finally:
            with self._changed:
                self.held -= size
                self._changed.notify_all()


def _pinned(version: str | None) -> dict[str, str]:
    return {"IfMatch": version} if version else {}
