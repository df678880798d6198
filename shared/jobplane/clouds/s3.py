"""ObjectStore over S3 (boto3): conditional writes with If-None-Match / If-Match, and files moved by
boto3's managed transfer (s3transfer): multipart uploads and ranged downloads, parts in parallel, retried.

Files up to one part go in a single PutObject / GetObject, whose response carries the ETag; larger ones go
through one TransferManager per store, shared by every call, so the concurrency limit holds across files.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from datetime import UTC
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import ClientError
from s3transfer.exceptions import S3DownloadFailedError
from s3transfer.subscribers import BaseSubscriber

from jobplane.clouds.base import Blob, NotFound, ObjectInfo, PreconditionFailed, Progress, TransferLimits
from jobplane.clouds.streams import atomic_file

# 409 ConditionalRequestConflict: a concurrent conditional write is in flight; the caller re-reads and
# retries exactly as for 412, so both map to PreconditionFailed.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}

# s3v4 and virtual-hosted addressing: presigned URLs (vm_request) name the bucket's own region
# (bucket.s3.<region>.amazonaws.com), as SigV4 needs; with the global endpoint a VM outside us-east-1 would
# be redirected. Requests are SigV4 anyway, and an IP endpoint (moto) still gets path-style URLs.
RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8}, signature_version="s3v4",
                 s3={"addressing_style": "virtual"},
                 max_pool_connections=32)  # room for a transfer's parallel parts plus the agent's other calls
MIN_PART = 5 << 20  # S3 refuses smaller parts (except the last)
_READ = 1 << 20  # bytes per read when streaming a single GetObject body to disk
_IO_CHUNK = 256 << 10  # s3transfer's default size of the pieces a download hands to its disk writer


def s3_client(region: str | None = None, session: Any = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (moto server, local cloud) with adaptive retries; session: a boto3
    Session whose credentials to use (the job's vended ones), else the default chain's."""
    return (session or boto3).client("s3", region_name=region, config=RETRIES)


class _Known(BaseSubscriber):  # type: ignore[misc]
    """Tells s3transfer what a listing already said (no HeadObject), and relays progress."""

    def __init__(self, size: int | None, etag: str | None, progress: Progress | None) -> None:
        self._size, self._etag, self._progress = size, etag, progress

    def on_queued(self, future: Any, **_: Any) -> None:
        meta = future.meta  # the CRT client's meta has neither method: it asks S3 itself
        if self._size is not None and hasattr(meta, "provide_transfer_size"):
            meta.provide_transfer_size(self._size)
        if self._etag is not None and hasattr(meta, "provide_object_etag"):
            meta.provide_object_etag(self._etag)  # every ranged GET carries If-Match: a change fails with 412

    def on_progress(self, bytes_transferred: int, **_: Any) -> None:
        if self._progress:
            self._progress(bytes_transferred)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mapped(exc: ClientError, key: str) -> Exception:
    code = _code(exc)
    if code in _LOST_RACE:
        return PreconditionFailed(f"{key}: {code}")
    if code in _MISSING:
        return NotFound(key)
    return cast(Exception, exc)


class S3Store:
    def __init__(self, bucket: str, client: Any = None, limits: TransferLimits | None = None,
                 transfer_client: str = "classic") -> None:
        """transfer_client: "classic" (s3transfer's threads), "crt" (awscrt, when installed) or "auto"."""
        self.bucket = bucket
        self.client = client or s3_client()
        limits = limits or TransferLimits()
        self.limits = TransferLimits(max(limits.part_size, MIN_PART), limits.concurrency)
        self._transfer_client = transfer_client
        self._manager: Any = None
        self._manager_lock = threading.Lock()

    def get(self, key: str) -> Blob:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _MISSING:
                raise NotFound(key) from None
            raise
        return Blob(data=resp["Body"].read(), version=str(resp["ETag"]),
                    last_modified=resp["LastModified"].astimezone(UTC))

    def _put(self, key: str, data: bytes, content_type: str, **cond: str) -> str:
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type, **cond)
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

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    vm_auth = None  # the URLs carry their own signature

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(method, presigned URL) with which a VM without credentials or SDK reads or writes this key."""
        url = self.client.generate_presigned_url("put_object" if write else "get_object",
                                                 Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires)
        return ("PUT" if write else "GET"), str(url)

    # ---- files -------------------------------------------------------------------------------------------
    def _transfers(self) -> Any:
        with self._manager_lock:
            if self._manager is None:
                part, threads = self.limits.part_size, self.limits.concurrency
                config = TransferConfig(multipart_threshold=part + 1, multipart_chunksize=part,
                                        max_concurrency=threads, preferred_transfer_client=self._transfer_client)
                if self._transfer_client == "classic":  # (the CRT client refuses these and bounds its own)
                    # downloaded chunks wait in the io queue for the disk: cap it at what the parts in flight hold
                    config.max_io_queue, config.io_chunksize = max(4, part * threads // _IO_CHUNK), _IO_CHUNK
                self._manager = create_transfer_manager(self.client, config)
            return self._manager

    def upload_file(self, key: str, path: Path, content_type: str = "application/octet-stream",
                    progress: Progress | None = None) -> str:
        size = path.stat().st_size
        try:
            if size <= self.limits.part_size:
                # read once, sent as bytes: a file rewritten in place meanwhile (torch.save on a checkpoint) would
                # send fewer bytes than the Content-Length taken before, and S3 would wait for the rest until a timeout
                body = path.read_bytes()
                resp = self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)
                size = len(body)
                if progress:
                    progress(size)
                return str(resp["ETag"])
            future = self._transfers().upload(str(path), self.bucket, key, extra_args={"ContentType": content_type},
                                              subscribers=[_Known(size, None, progress)])
            future.result()
            # s3transfer does not surface CompleteMultipartUpload's ETag; one HEAD per multi-part file is cheap
            return str(self.client.head_object(Bucket=self.bucket, Key=key)["ETag"])
        except ClientError as exc:
            raise _mapped(exc, key) from None

    def download_file(self, key: str, path: Path, *, version: str | None = None, size: int | None = None,
                      progress: Progress | None = None) -> str:
        try:
            if size is None:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
                size = int(head["ContentLength"])
                if version is not None and head["ETag"] != version:
                    raise PreconditionFailed(f"{key} is at {head['ETag']}, not {version}")
                version = str(head["ETag"])
            if size <= self.limits.part_size:
                return self._get_whole(key, path, version, progress)
            path.parent.mkdir(parents=True, exist_ok=True)
            future = self._transfers().download(self.bucket, key, str(path),  # s3transfer renames into place
                                                subscribers=[_Known(size, version, progress)])
            try:
                future.result()
            except S3DownloadFailedError as exc:  # how s3transfer reports a 412 on a ranged GET
                if isinstance(exc.__context__, ClientError) and _code(exc.__context__) in _LOST_RACE:
                    raise PreconditionFailed(f"{key} changed during the download") from None
                raise
            return str(future.meta.etag)
        except ClientError as exc:
            raise _mapped(exc, key) from None

    def _get_whole(self, key: str, path: Path, version: str | None, progress: Progress | None) -> str:
        resp = self.client.get_object(Bucket=self.bucket, Key=key, **({"IfMatch": version} if version else {}))
        with atomic_file(path) as tmp, tmp.open("wb") as out:
            for chunk in resp["Body"].iter_chunks(_READ):
                out.write(chunk)
                if progress:
                    progress(len(chunk))
        return str(resp["ETag"])
