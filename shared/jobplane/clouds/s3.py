"""ObjectStore over S3 (boto3): conditional writes with If-None-Match / If-Match."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC
from typing import Any
from urllib.parse import urlencode

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from jobplane.clouds.base import Blob, NotFound, ObjectInfo, PreconditionFailed

# 409 ConditionalRequestConflict: a concurrent conditional write is in flight; the caller re-reads and
# retries exactly as for 412, so both map to PreconditionFailed.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}

# s3v4 and virtual-hosted addressing: presigned URLs (vm_request) name the bucket's own region
# (bucket.s3.<region>.amazonaws.com), as SigV4 needs; with the global endpoint a VM outside us-east-1 would
# be redirected. Requests are SigV4 anyway, and an IP endpoint (moto) still gets path-style URLs.
RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8}, signature_version="s3v4",
                 s3={"addressing_style": "virtual"})


def s3_client(region: str | None = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (moto server, local cloud) with adaptive retries."""
    return boto3.client("s3", region_name=region, config=RETRIES)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Store:
    def __init__(self, bucket: str, client: Any = None) -> None:
        self.bucket = bucket
        self.client = client or s3_client()

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
            if _code(exc) in _LOST_RACE:
                raise PreconditionFailed(f"{key}: {_code(exc)}") from None
            if cond and _code(exc) in _MISSING:  # If-Match on a missing key
                raise NotFound(key) from None
            raise
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
                                 size=int(obj["Size"]))

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    vm_auth = None  # the URLs carry their own signature

    def vm_request(self, key: str, *, write: bool, expires: int) -> tuple[str, str]:
        """(method, presigned URL) with which a VM without credentials or SDK reads or writes this key."""
        url = self.client.generate_presigned_url("put_object" if write else "get_object",
                                                 Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires)
        return ("PUT" if write else "GET"), str(url)
