"""Whole objects through awscrt's S3 client: a compiled request path (signing, HTTP and its connection pool in C).

botocore builds, signs and parses every request in Python, about 2 ms of CPU each; with many small files (a
sharded checkpoint, a folder of images as an input channel) that bounds a transfer on a VM's few cores near 500
files a second. awscrt does the same request for a fraction of that. The agent bundle carries awscrt for each
architecture; where it cannot be imported, or the client's endpoint is not one this module knows how to address,
`CrtObjects.of` returns None and S3Store stays on botocore.

Same contract as S3Store's one-request path: an upload sends the bytes it was given (read once) with their
Content-MD5, which S3 checks; a download can be pinned with If-Match and lands in the path given (the caller's
atomic temporary file). 404 is NotFound, 409 and 412 PreconditionFailed, anything else StoreError. Credentials
are the boto3 client's own (a job's vended, refreshing ones included), asked for at each signing.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from awscrt import auth, http, s3
from awscrt import io as crt_io

from jobplane.clouds.base import NotFound, PreconditionFailed, StoreError

_LOST_RACE = {409, 412}


class CrtObjects:
    """PUT and GET of whole objects in one bucket, on one awscrt S3 client (its own event-loop threads)."""

    def __init__(self, bucket: str, region: str, host: str, tls: bool, path_style: bool, credentials: Any,
                 part_size: int) -> None:
        self.host = host
        self._root = f"/{quote(bucket)}/" if path_style else "/"

        def frozen() -> auth.AwsCredentials:
            now = credentials.get_frozen_credentials()  # refreshed by botocore when near its expiry
            return auth.AwsCredentials(now.access_key, now.secret_key, now.token)

        provider = auth.AwsCredentialsProvider.new_delegate(frozen)
        bootstrap = crt_io.ClientBootstrap.get_or_create_static_default()
        self._client = s3.S3Client(
            bootstrap=bootstrap, region=region,
            signing_config=s3.create_default_s3_signing_config(region=region, credential_provider=provider),
            tls_mode=s3.S3RequestTlsMode.ENABLED if tls else s3.S3RequestTlsMode.DISABLED,
            part_size=part_size)  # the files it gets are of one part: one GET each

    @classmethod
    def of(cls, bucket: str, client: Any, part_size: int) -> CrtObjects | None:
        """The compiled path for this boto3 client's bucket, or None where it cannot serve it: no signing
        credentials, or a bucket name virtual hosting cannot carry over TLS (dots)."""
        credentials = client._request_signer._credentials  # botocore's own, as it signs with them
        if credentials is None:
            return None
        url = urlsplit(client.meta.endpoint_url)
        region = client.meta.region_name or "us-east-1"
        host = url.hostname or ""
        if host.endswith(".amazonaws.com"):  # AWS: virtual-hosted in the bucket's region, as the client addresses it
            if "." in bucket:
                return None
            return cls(bucket, region, f"{bucket}.s3.{region}.amazonaws.com", True, False, credentials, part_size)
        # an endpoint of its own (AWS_ENDPOINT_URL: the local cloud's moto, a bench's rclone): path-style
        return cls(bucket, region, url.netloc, url.scheme == "https", True, credentials, part_size)

    def _path(self, key: str) -> str:
        return self._root + quote(key, safe="/~")

    def put(self, key: str, body: bytes, content_type: str, content_md5: str) -> str:
        """One PutObject of body, which S3 checks against its Content-MD5; returns the ETag."""
        headers = http.HttpHeaders([("Host", self.host), ("Content-Length", str(len(body))),
                                    ("Content-Type", content_type), ("Content-MD5", content_md5)])
        request = http.HttpRequest("PUT", self._path(key), headers, io.BytesIO(body))
        return self._run(key, s3.S3RequestType.PUT_OBJECT, request)

    def get(self, key: str, dest: Path, version: str | None = None) -> str:
        """The object into dest (created or replaced), pinned to version if given; returns its ETag."""
        return self._run(key, s3.S3RequestType.GET_OBJECT, self._get(key, version), version, recv_filepath=str(dest))

    def get_many(self, gets: Sequence[tuple[str, Path, str | None]], in_flight: int) -> list[str | Exception]:
        """get() of each (key, dest, version), at most in_flight at once, with no thread waiting on each request:
        the client's threads report each outcome, this one only keeps the requests coming. Per get, in order,
        its ETag or its error."""
        out: list[str | Exception] = [StoreError("not started")] * len(gets)
        slots = threading.Semaphore(in_flight)  # a slot is taken per request, given back with its outcome
        running: list[s3.S3Request] = []  # each request's Python object lives until the batch ends

        def finish(n: int, outcome: str | Exception) -> None:
            out[n] = outcome
            slots.release()

        for n, (key, dest, version) in enumerate(gets):
            slots.acquire()
            running.append(self._start(key, s3.S3RequestType.GET_OBJECT, self._get(key, version), version,
                                        partial(finish, n), recv_filepath=str(dest)))
        for _ in range(in_flight):  # every slot back: every request has ended
            slots.acquire()
        return out

    def _get(self, key: str, version: str | None) -> http.HttpRequest:
        headers = http.HttpHeaders([("Host", self.host), *([("If-Match", version)] if version else [])])
        return http.HttpRequest("GET", self._path(key), headers)

    def _run(self, key: str, kind: s3.S3RequestType, request: http.HttpRequest, pinned: str | None = None,
             **more: Any) -> str:
        outcome: list[str | Exception] = []
        done = threading.Event()

        def finish(result: str | Exception) -> None:
            outcome.append(result)
            done.set()

        started = self._start(key, kind, request, pinned, finish, **more)
        done.wait()
        del started
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    def _start(self, key: str, kind: s3.S3RequestType, request: http.HttpRequest, pinned: str | None,
               finish: Callable[[str | Exception], None], **more: Any) -> s3.S3Request:
        """The request under way; finish(its ETag or its error) is called on the client's thread at its end."""
        etag: list[str] = [pinned] if pinned else []  # If-Match held: the object is that version

        def on_headers(status_code: int, headers: list[tuple[str, str]], **_: Any) -> None:
            etag.extend(value for name, value in headers if name.lower() == "etag")

        def on_done(error: Exception | None = None, status_code: int | None = None, **_: Any) -> None:
            finish(_outcome(key, error, status_code, etag))

        # each callback takes the GIL on the client's thread: no headers callback where the ETag is known
        return self._client.make_request(type=kind, request=request, on_headers=None if pinned else on_headers,
                                         on_done=on_done, **more)


def _outcome(key: str, error: Exception | None, status_code: int | None, etag: list[str]) -> str | Exception:
    if error is None:
        return etag[-1] if etag else StoreError(f"{key}: S3's response carried no ETag")
    if status_code == 404:
        return NotFound(key)
    if status_code in _LOST_RACE:
        return PreconditionFailed(f"{key}: {status_code}")
    if status_code:
        return StoreError(f"{key}: HTTP {status_code} from S3")
    return StoreError(f"{key}: {error}")  # awscrt's own: a connection refused or broken, a timeout

