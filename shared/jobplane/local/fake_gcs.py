"""In-process fake of the GCS JSON API that enforces generation preconditions the way GCS does.

gcp-storage-emulator ignores ifGenerationMatch and fake-gcs-server skips it on reads and deletes, yet the
registry's single-writer rule rests on exactly those checks, so this fake answers 412 wherever GCS would
(tests/clouds/test_store_conformance.py runs the store suite on both, and says where they differ). It speaks
what google-cloud-storage sends: bucket get/create, object metadata, media and range downloads (what
transfer_manager's sliced downloads use), multipart, media and resumable uploads, paged listing and delete.
Point the client at it with STORAGE_EMULATOR_HOST=<endpoint>, or run it alone:
`python -m jobplane.local.fake_gcs -p 9023 --bucket b`.
For tests it records the size of every request body that carried an object's bytes and of every response
that served them (`received`, `served`), and can fail the next requests to a route (`fail_next`).

It also plays STS (`POST /v1/token`, jobplane.local.fake_sts): a token it mints there carries the Credential
Access Boundary it was asked for (`boundaries`), and a request bearing it gets 403, with GCS's error JSON,
unless a rule's role holds the permission on that object or listing prefix. With `vm_reads` ("bucket/prefix"),
the VM's own token (the metadata server's) may only read under those prefixes of those buckets, and read any
other bucket (data buckets), as infra/gcp grants the VMs' service account. With `member_registry`
("bucket[/root]"), a token `member-<owner>` is the local cloud's stand-in for a member of the module's
`submitters[<owner>]` group: it gets exactly what infra/gcp grants one on that registry (jobplane.local.gcp_grants:
create under its owner's queue/, code/ and cancels/, read the records and its own team's data, list), and nothing
in any other bucket. With `grants`, a service account's token (the functions', jobplane.local.module_iam) gets its
role on its bucket and nothing elsewhere, and what STS mints from it no more. Any other token, or none (the CLI,
tests), is unenforced.
It counts its writes and deletes by area (jobplane.local.changes), answered at GET /_jobplane/changes.
Out of scope: object versioning, ACLs, metadata patches, compose/copy/rewrite, XML API multipart uploads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, unquote_to_bytes

import google_crc32c
from werkzeug.http import http_date, parse_options_header
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from jobplane.local import changes, fake_sts, gcp_grants
from jobplane.local.gce_metadata_server import VM_ACCESS_TOKEN
from jobplane.local.keep_alive import keep_alive
from jobplane.local.loopback import BackgroundServer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

_OBJECT = r"/b/(?P<bucket>[^/]+)/o/(?P<name>.+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in [
        ("POST", r"/storage/v1/b", "_create_bucket"),
        ("GET", r"/storage/v1/b/(?P<bucket>[^/]+)", "_get_bucket"),
        ("GET", r"/storage/v1/b/(?P<bucket>[^/]+)/o", "_list"),
        ("GET", r"/storage/v1" + _OBJECT, "_get_object"),
        ("GET", r"/download/storage/v1" + _OBJECT, "_download"),
        ("DELETE", r"/storage/v1" + _OBJECT, "_delete"),
        ("POST", r"/upload/storage/v1/b/(?P<bucket>[^/]+)/o", "_upload"),
        ("PUT", r"/upload/storage/v1/b/(?P<bucket>[^/]+)/o", "_resumable_chunk"),
        ("POST", r"/v1/token", "_sts_token"),
        ("GET", re.escape(changes.PATH), "_changes"),
    ]
]
_IAM = {"get": "objects.get", "list": "objects.list", "create": "objects.create", "delete": "objects.delete",
        "buckets.get": "buckets.get", "buckets.create": "buckets.create"}
_CONTENT_RANGE = re.compile(r"bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<total>\d+|\*)")
_RANGE = re.compile(r"bytes=(?P<start>\d+)-(?P<end>\d*)")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # a line per request drowns test output; werkzeug still logs errors


class _HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class _Object:
    name: str
    data: bytes
    content_type: str
    generation: int
    created: datetime
    metadata: dict[str, str] | None
    metageneration: int = 1
    md5: str = field(init=False)
    crc32c: str = field(init=False)

    def __post_init__(self) -> None:
        self.md5, self.crc32c = _md5(self.data), _crc32c(self.data)


@dataclass
class _Session:
    """A resumable upload in progress; preconditions are evaluated when it completes."""

    bucket: str
    content_type: str
    metadata: dict[str, Any]
    args: dict[str, str]  # the initiating request's query: name and preconditions
    data: bytearray = field(default_factory=bytearray)
    chunks: list[int] = field(default_factory=list)  # sizes of the requests that carried the bytes


@dataclass(frozen=True)
class _Call:
    """What a handler needs from the request: its headers, lower-cased query, body and base URL."""

    request: Request
    args: dict[str, str]
    body: bytes

    @property
    def host(self) -> str:
        return self.request.host_url.rstrip("/")

    def header(self, name: str) -> str:
        return self.request.headers.get(name, "")

    @property
    def token(self) -> str | None:
        kind, _, token = self.header("Authorization").partition(" ")
        return token.strip() if kind.lower() == "bearer" and token.strip() else None


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _rfc3339(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def _now() -> datetime:
    # GCS reports milliseconds; truncating here keeps upload responses and listings identical.
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body), status, mimetype="application/json")


def _error(err: _HttpError) -> Response:
    if err.code == 304:
        return Response(status=304)  # no body, as HTTP requires
    errors = [{"message": err.message, "domain": "global", "reason": err.reason}]
    return _json({"error": {"code": err.code, "message": err.message, "errors": errors}}, err.code)


def _int_arg(args: dict[str, str], name: str) -> int | None:
    value = args.get(name.lower())
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise _HttpError(400, "invalid", f"Invalid value for {name}: {value}") from None


class FakeGcsServer(BackgroundServer):
    """A thread-safe GCS fake served by werkzeug on 127.0.0.1 from a background thread.

    Usage: `with FakeGcsServer() as server: server.create_bucket("b")`, then set
    STORAGE_EMULATOR_HOST=server.endpoint before building a storage.Client.
    """

    name = "fake-gcs"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, vm_reads: tuple[str, ...] = (),
                 fd: int | None = None, member_registry: str | None = None,
                 grants: dict[str, tuple[fake_sts.Rule, ...]] | None = None) -> None:
        """fd: a listening socket to serve on instead of binding host:port (one a parent process bound).
        member_registry: the registry, bucket[/root], whose submitters' grants member-<owner> tokens get.
        grants: a service account's token -> its bindings (the functions', jobplane.local.module_iam)."""
        super().__init__(host, port)
        self._fd = fd
        self._vm_rules = fake_sts.read_only(vm_reads)
        self._member_registry = member_registry
        self.boundaries: dict[str, dict[str, Any]] = {}  # minted token -> the boundary (STS options) it carries
        self._rules: dict[str, tuple[fake_sts.Rule, ...]] = {}
        self._grants = dict(grants or {})
        self._lock = threading.Lock()  # guards every field below; each request runs under it
        self._buckets: dict[str, dict[str, _Object]] = {}
        self._bucket_created: dict[str, datetime] = {}
        self._sessions: dict[str, _Session] = {}
        self._last_generation = 0
        self.changes = changes.Changes()  # noted under the lock, with the change: a reader sees both or neither
        self._faults: dict[str, list[int]] = {}  # handler -> statuses to answer its next requests with
        self.received: dict[str, list[int]] = {}  # object name -> body sizes of the upload requests that wrote it
        self.served: dict[str, list[int]] = {}  # object name -> body sizes of the responses that served it

    # -- lifecycle -------------------------------------------------------------------------------

    def make_server(self) -> BaseWSGIServer:
        return make_server(self._host, self._port, self._wsgi, threaded=True, request_handler=keep_alive(_QuietHandler),
                           fd=self._fd)

    @property
    def endpoint(self) -> str:
        """Base URL for STORAGE_EMULATOR_HOST, e.g. http://127.0.0.1:PORT."""
        return f"http://{self.address}"

    @property
    def sts_url(self) -> str:
        """The token-exchange endpoint (JOBPLANE_STS_URL)."""
        return f"{self.endpoint}/v1/token"

    def create_bucket(self, name: str) -> None:
        """Create a bucket directly (no HTTP); a no-op if it exists, so fixtures can call it freely."""
        with self._lock:
            self._buckets.setdefault(name, {})
            self._bucket_created.setdefault(name, _now())

    def reset(self) -> None:
        """Forget every bucket, object and upload session (the server keeps running)."""
        with self._lock:
            self.changes.note(changes.ANY)
            self._buckets.clear()
            self._bucket_created.clear()
            self._sessions.clear()
            self._faults.clear()
            self.boundaries.clear()
            self._rules.clear()
            self.received.clear()
            self.served.clear()

    def fail_next(self, route: str, count: int = 1, status: int = 503) -> None:
        """Answer the next `count` requests to a route ("download", "resumable_chunk", "upload") with
        `status`, before they touch any state: a network or server blip the client must retry."""
        with self._lock:
            self._faults.setdefault("_" + route, []).extend([status] * count)

    def faults_pending(self) -> int:
        """How many injected failures have not been served yet."""
        with self._lock:
            return sum(len(statuses) for statuses in self._faults.values())

    # -- WSGI plumbing ---------------------------------------------------------------------------

    def _wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        # Route on the raw URI: PATH_INFO is already unquoted, which would split names containing %2F.
        raw = str(environ.get("REQUEST_URI") or request.full_path).split("?", 1)[0]
        # Lower-case query keys: the client spells one of them ifMetaGenerationNotMatch. The body is read
        # before taking the lock so a slow upload does not stall other requests.
        call = _Call(request, {k.lower(): v for k, v in request.args.items()}, request.get_data())
        try:
            for method, pattern, handler in _ROUTES:
                match = pattern.fullmatch(raw)
                if match and method == request.method:
                    params = {k: unquote_to_bytes(v).decode() for k, v in match.groupdict().items()}
                    with self._lock:
                        if self._faults.get(handler):
                            raise _HttpError(self._faults[handler].pop(0), "backendError", "injected fault")
                        response: Response = getattr(self, handler)(call, **params)
                    break
            else:
                raise _HttpError(404, "notFound", f"No route for {request.method} {raw}")
        except _HttpError as err:
            response = _error(err)
        except ValueError as err:  # undecodable JSON, page token or name: the client's fault, as on GCS
            response = _error(_HttpError(400, "invalid", str(err)))
        return response(environ, start_response)

    # -- helpers (called with the lock held) -----------------------------------------------------

    def _bucket(self, name: str) -> dict[str, _Object]:
        try:
            return self._buckets[name]
        except KeyError:
            raise _HttpError(404, "notFound", f"The specified bucket does not exist: {name}") from None

    def _authorize(self, call: _Call, permission: str, bucket: str, name: str | None = None,
                   list_prefix: str | None = None) -> None:
        """403 unless the request's token may do this (see the module's docstring)."""
        token = call.token
        members = gcp_grants.token_rules(token, self._member_registry) if token and self._member_registry else None
        if token in self._rules:
            ok = fake_sts.allowed(self._rules[token], permission, bucket, name, list_prefix)
        elif token in self._grants:
            ok = fake_sts.allowed(self._grants[token], permission, bucket, name, list_prefix)
        elif members is not None:
            ok = fake_sts.allowed(members, permission, bucket, name, list_prefix)
        elif token == VM_ACCESS_TOKEN and self._vm_rules:
            vm_buckets = {r.bucket for r in self._vm_rules}
            ok = fake_sts.allowed(self._vm_rules, permission, bucket, name, list_prefix) or (
                bucket not in vm_buckets and permission in fake_sts.ROLE_PERMISSIONS["roles/storage.objectViewer"])
        else:
            return
        if not ok:
            what = f"object {bucket}/{name}" if name is not None else f"bucket {bucket} (prefix {list_prefix!r})"
            raise _HttpError(403, "forbidden", f"The caller does not have storage.{_IAM[permission]} access to "
                             f"the Google Cloud Storage {what}. Permission 'storage.{_IAM[permission]}' denied "
                             "on resource (or it may not exist).")

    def _next_generation(self) -> int:
        # Like GCS: microsecond timestamps, forced strictly increasing across all objects.
        self._last_generation = max(self._last_generation + 1, time.time_ns() // 1000)
        return self._last_generation

    def _live(self, call: _Call, bucket: str, name: str) -> _Object:
        """The object a read or delete targets: 404 if missing or if ?generation= is not the live one."""
        obj = self._bucket(bucket).get(name)
        generation = _int_arg(call.args, "generation")
        if obj is None or (generation is not None and generation != obj.generation):
            raise _HttpError(404, "notFound", f"No such object: {bucket}/{name}")
        return obj

    @staticmethod
    def _check(obj: _Object | None, args: dict[str, str], read: bool = False) -> None:
        """Evaluate if(Meta)generation(Not)Match; a missing object has generation 0 (so 0 = create-only)."""
        generation = obj.generation if obj else 0
        failed = _HttpError(412, "conditionNotMet", "At least one of the pre-conditions did not hold.")
        # GCS answers a failed *NotMatch on a read with 304 Not Modified, and with 412 on a write.
        not_modified = _HttpError(304, "notModified", "Not Modified") if read else failed
        if (want := _int_arg(args, "ifGenerationMatch")) is not None and generation != want:
            raise failed
        if (want := _int_arg(args, "ifGenerationNotMatch")) is not None and generation == want:
            raise not_modified
        if (want := _int_arg(args, "ifMetagenerationMatch")) is not None and (
            obj is None or obj.metageneration != want
        ):
            raise failed
        if (want := _int_arg(args, "ifMetagenerationNotMatch")) is not None and (
            obj is not None and obj.metageneration == want
        ):
            raise not_modified

    @staticmethod
    def _resource(call: _Call, bucket: str, obj: _Object) -> dict[str, Any]:
        path = f"/b/{bucket}/o/{quote(obj.name, safe='')}"
        created = _rfc3339(obj.created)
        resource: dict[str, Any] = {
            "kind": "storage#object",
            "id": f"{bucket}/{obj.name}/{obj.generation}",
            "selfLink": f"{call.host}/storage/v1{path}",
            "mediaLink": f"{call.host}/download/storage/v1{path}?generation={obj.generation}&alt=media",
            "name": obj.name,
            "bucket": bucket,
            "generation": str(obj.generation),
            "metageneration": str(obj.metageneration),
            "contentType": obj.content_type,
            "storageClass": "STANDARD",
            "size": str(len(obj.data)),
            "md5Hash": obj.md5,
            "crc32c": obj.crc32c,
            "etag": base64.b64encode(f"{obj.generation}/{obj.metageneration}".encode()).decode(),
            "timeCreated": created,
            "updated": created,  # no metadata patches, so an object never changes after its write
            "timeStorageClassUpdated": created,
        }
        if obj.metadata:
            resource["metadata"] = obj.metadata
        return resource

    def _write(
        self,
        call: _Call,
        bucket: str,
        meta: dict[str, Any],
        data: bytes,
        content_type: str,
        args: dict[str, str],
        chunks: list[int],
    ) -> Response:
        """Store an upload's bytes if its preconditions (`args`, from the initiating request) hold."""
        objects = self._bucket(bucket)
        name = meta.get("name") or args.get("name")
        if not name:
            raise _HttpError(400, "required", "Required parameter: name")
        obj = _Object(
            name=name,
            data=data,
            content_type=meta.get("contentType") or content_type or "application/octet-stream",
            generation=0,
            created=_now(),
            metadata=meta.get("metadata"),
        )
        # The client sends the checksum it computed; GCS rejects the upload if the bytes disagree.
        for key, actual in (("crc32c", obj.crc32c), ("md5Hash", obj.md5)):
            if meta.get(key) and meta[key] != actual:
                raise _HttpError(400, "invalid", f"Provided {key} {meta[key]} does not match {actual}")
        self._authorize(call, "create", bucket, name)
        if name in objects:  # GCS: overwriting needs delete as well
            self._authorize(call, "delete", bucket, name)
        self._check(objects.get(name), args)
        obj.generation = self._next_generation()
        objects[name] = obj
        self.changes.note(changes.object_area(bucket, name))
        self.received[name] = chunks
        return _json(self._resource(call, bucket, obj))

    # -- handlers (called with the lock held) ----------------------------------------------------

    def _create_bucket(self, call: _Call) -> Response:
        name = json.loads(call.body or b"{}").get("name")
        self._authorize(call, "buckets.create", str(name))
        if not name:
            raise _HttpError(400, "required", "Required parameter: name")
        if name in self._buckets:
            raise _HttpError(409, "conflict", "Your previous request to create the named bucket succeeded.")
        self._buckets[name], self._bucket_created[name] = {}, _now()
        self.changes.note(changes.object_area(name, ""))
        return self._get_bucket(call, bucket=name)

    def _get_bucket(self, call: _Call, bucket: str) -> Response:
        self._authorize(call, "buckets.get", bucket)
        self._bucket(bucket)
        created = _rfc3339(self._bucket_created[bucket])
        return _json(
            {
                "kind": "storage#bucket",
                "id": bucket,
                "name": bucket,
                "selfLink": f"{call.host}/storage/v1/b/{bucket}",
                "metageneration": "1",
                "location": "US",
                "storageClass": "STANDARD",
                "timeCreated": created,
                "updated": created,
                "etag": "CAE=",
            }
        )

    def _list(self, call: _Call, bucket: str) -> Response:
        objects, args = self._bucket(bucket), call.args
        prefix, delimiter = args.get("prefix", ""), args.get("delimiter", "")
        self._authorize(call, "list", bucket, list_prefix=prefix)
        start, end = args.get("startoffset", ""), args.get("endoffset")
        limit = min(_int_arg(args, "maxResults") or 1000, 1000)
        # The page token is the last entry served, ("i", name) or ("p", collapsed prefix), so a page never
        # repeats an item and a collapsed prefix is not served again on the next page.
        after: list[str] | None = (
            json.loads(base64.urlsafe_b64decode(args["pagetoken"])) if args.get("pagetoken") else None
        )
        items: list[dict[str, Any]] = []
        prefixes: list[str] = []
        last: list[str] | None = None
        for name in sorted(objects):
            if not name.startswith(prefix) or name < start or (end is not None and name >= end):
                continue
            if after and (name <= after[1] or (after[0] == "p" and name.startswith(after[1]))):
                continue
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            entry = ["p", name[: cut + len(delimiter)]] if cut >= 0 else ["i", name]
            if entry == last:
                continue  # another name under the prefix just collapsed
            if len(items) + len(prefixes) == limit:
                return _json(
                    _page(items, prefixes, base64.urlsafe_b64encode(json.dumps(last).encode()).decode())
                )
            last = entry
            if entry[0] == "p":
                prefixes.append(entry[1])
            else:
                items.append(self._resource(call, bucket, objects[name]))
        return _json(_page(items, prefixes, None))

    def _get_object(self, call: _Call, bucket: str, name: str) -> Response:
        if call.args.get("alt") == "media":
            return self._download(call, bucket, name)
        self._authorize(call, "get", bucket, name)
        obj = self._live(call, bucket, name)
        self._check(obj, call.args, read=True)
        return _json(self._resource(call, bucket, obj))

    def _download(self, call: _Call, bucket: str, name: str) -> Response:
        self._authorize(call, "get", bucket, name)
        obj = self._live(call, bucket, name)
        self._check(obj, call.args, read=True)
        body, status, size = obj.data, 200, len(obj.data)
        if (ranged := _RANGE.fullmatch(call.header("Range").strip())) is not None:
            start, end = int(ranged["start"]), min(int(ranged["end"] or size - 1), size - 1)
            if start >= size or end < start:
                raise _HttpError(416, "requestedRangeNotSatisfiable", f"Range {call.header('Range')} of {size}")
            body, status = obj.data[start : end + 1], 206
        self.served.setdefault(name, []).append(len(body))
        response = Response(body, status, content_type=obj.content_type)
        if status == 206:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        response.headers.update(
            {
                "X-Goog-Generation": str(obj.generation),
                "X-Goog-Metageneration": str(obj.metageneration),
                "X-Goog-Hash": f"crc32c={obj.crc32c},md5={obj.md5}",  # the client verifies the bytes
                "X-Goog-Stored-Content-Length": str(len(obj.data)),
                "X-Goog-Stored-Content-Encoding": "identity",
                "X-Goog-Storage-Class": "STANDARD",
                "Last-Modified": http_date(obj.created),
                "ETag": f'"{obj.md5}"',
            }
        )
        return response

    def _delete(self, call: _Call, bucket: str, name: str) -> Response:
        self._authorize(call, "delete", bucket, name)
        obj = self._live(call, bucket, name)
        self._check(obj, call.args)
        del self._buckets[bucket][name]
        self.changes.note(changes.object_area(bucket, name))
        return Response(status=204)

    def _changes(self, call: _Call) -> Response:
        return Response(self.changes.body(), content_type="application/json")

    def _upload(self, call: _Call, bucket: str) -> Response:
        kind = call.args.get("uploadtype", "media")
        if kind == "media":
            return self._write(call, bucket, {}, call.body, call.header("Content-Type"), call.args, [len(call.body)])
        if kind == "multipart":
            meta, data, content_type = _parse_multipart(call.body, call.header("Content-Type"))
            return self._write(call, bucket, meta, data, content_type, call.args, [len(call.body)])
        if kind == "resumable":  # the client uses these only above 8 MiB or for streams of unknown size
            self._bucket(bucket)
            upload_id = uuid.uuid4().hex
            meta = json.loads(call.body) if call.body.strip() else {}
            # the session URL is the capability for its chunks: the token is checked here and at the end
            name = str(meta.get("name") or call.args.get("name") or "")
            self._authorize(call, "create", bucket, name)
            self._sessions[upload_id] = _Session(
                bucket, call.header("X-Upload-Content-Type"), meta, call.args
            )
            response = Response(status=200)
            response.headers["Location"] = (
                f"{call.host}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
            )
            return response
        raise _HttpError(400, "invalid", f"Unsupported uploadType: {kind}")

    def _resumable_chunk(self, call: _Call, bucket: str) -> Response:
        upload_id = call.args.get("upload_id", "")
        session = self._sessions.get(upload_id)
        if session is None or session.bucket != bucket:
            raise _HttpError(404, "notFound", "No such upload session")
        header = call.header("Content-Range") or f"bytes 0-{len(call.body) - 1}/{len(call.body)}"
        match = _CONTENT_RANGE.fullmatch(header.strip())
        if match is None:
            raise _HttpError(400, "invalid", f"Bad Content-Range: {header}")
        if match["start"] is not None:
            start = int(match["start"])
            if start > len(session.data):
                raise _HttpError(400, "invalid", "Chunk starts past the bytes received so far")
            session.data += call.body[len(session.data) - start :]  # skip bytes a retried chunk repeats
            session.chunks.append(len(call.body))
        if match["total"] == "*" or int(match["total"]) > len(session.data):
            response = Response(status=308)  # "resume incomplete", with the bytes persisted so far
            if session.data:
                response.headers["Range"] = f"bytes=0-{len(session.data) - 1}"
            return response
        del self._sessions[upload_id]
        data, args = bytes(session.data), session.args
        return self._write(call, bucket, session.metadata, data, session.content_type, args, session.chunks)

    def _sts_token(self, call: _Call) -> Response:
        """STS's token exchange: a new token carrying the boundary in `options` (OAuth-style errors)."""
        form = dict(parse_qsl(call.body.decode(errors="replace")))
        subject = form.get("subject_token", "")
        if subject in self._rules or subject == VM_ACCESS_TOKEN or (
                self._member_registry and subject.startswith(gcp_grants.MEMBER_TOKEN)):
            # STS would narrow an enforced token further; the fake exchanges only unenforced ones
            return _json({"error": "invalid_grant", "error_description": "the fake STS does not narrow a "
                          "downscoped, VM or member token"}, 400)
        try:
            rules = fake_sts.exchange(form)
        except fake_sts.BadBoundary as err:
            return _json({"error": "invalid_request", "error_description": str(err)}, 400)
        if subject in self._grants:  # a downscoped token reaches no further than the token it came from
            rules = fake_sts.within(rules, self._grants[subject])
        token = "sts-" + uuid.uuid4().hex
        self._rules[token] = rules
        self.boundaries[token] = json.loads(unquote(form["options"]))
        return _json({"access_token": token, "issued_token_type": fake_sts.ACCESS_TOKEN, "token_type": "Bearer",
                      "expires_in": 3600})


def _page(items: list[dict[str, Any]], prefixes: list[str], token: str | None) -> dict[str, Any]:
    # GCS omits empty fields rather than sending empty lists.
    page: dict[str, Any] = {"kind": "storage#objects"}
    if items:
        page["items"] = items
    if prefixes:
        page["prefixes"] = prefixes
    if token:
        page["nextPageToken"] = token
    return page


def _parse_multipart(body: bytes, content_type: str) -> tuple[dict[str, Any], bytes, str]:
    """Split a multipart/related upload into (JSON metadata, media bytes, media content type)."""
    boundary = parse_options_header(content_type)[1].get("boundary")
    if not boundary:
        raise _HttpError(400, "invalid", "multipart upload without a boundary")
    sep = b"--" + boundary.encode()
    first = body.find(sep)
    second, close = body.find(sep, first + 1), body.rfind(sep + b"--")
    if first < 0 or not first < second < close:
        raise _HttpError(400, "invalid", "malformed multipart body")

    def part(chunk: bytes) -> tuple[dict[str, str], bytes]:
        # Each part is CRLF, headers, blank line, payload, CRLF; the media may hold any bytes at all.
        head, _, payload = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return headers, payload.removesuffix(b"\r\n")

    _, meta = part(body[first + len(sep) : second])
    media_headers, data = part(body[second + len(sep) : close])
    return json.loads(meta or b"{}"), data, media_headers.get("content-type", "")


def main(argv: list[str] | None = None) -> None:
    """Serve the fake on loopback until SIGTERM or SIGINT (the local GCP cloud and the transfer benchmark run it
    in a process of its own, sharing no GIL with theirs)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m jobplane.local.fake_gcs", description=main.__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=0)
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    parser.add_argument("--vm-reads", action="append", default=[], metavar="BUCKET/PREFIX",
                        help="the VM's own token may read only here in that bucket (repeatable)")
    parser.add_argument("--member-grants", default=None, metavar="BUCKET[/ROOT]",
                        help="a token member-<owner> gets what infra/gcp grants submitters[<owner>] on this registry")
    parser.add_argument("--grant", action="append", default=[], metavar="TOKEN=ROLE",
                        help="a service account's token gets ROLE on the first --bucket and nothing elsewhere")
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    args = parser.parse_args(argv)
    grants: dict[str, tuple[fake_sts.Rule, ...]] = {
        token: (fake_sts.Rule(args.bucket[0], fake_sts.ROLE_PERMISSIONS[role], None),)
        for token, _, role in (g.partition("=") for g in args.grant)}
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    server = FakeGcsServer(args.host, args.port, vm_reads=tuple(args.vm_reads), fd=args.fd,
                           member_registry=args.member_grants, grants=grants)
    for name in args.bucket:  # before it answers: whoever sees it answer may use them (a request on the parent's
        server.create_bucket(name)  # socket can be waiting already)
    server.start()
    try:
        print(server.endpoint, flush=True)
        stopped.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
