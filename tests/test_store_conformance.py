"""One conformance suite for every ObjectStore: S3 (moto server), GCS (precondition-enforcing fake), memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from jobplane.clouds.base import NotFound, ObjectStore, PreconditionFailed
from jobplane.clouds.memory import MemoryStore
from jobplane.registry import backoff

pytestmark = pytest.mark.timeout(480)  # the 800-update races take 1-2 min on 2 loaded cores


@pytest.fixture(params=["memory", "s3", "gcs"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "s3":
        import boto3

        from jobplane.clouds.s3 import S3Store

        request.getfixturevalue("moto_endpoint")
        boto3.client("s3").create_bucket(Bucket="conformance")
        yield S3Store("conformance")
    else:
        from jobplane.clouds.gcs import GcsStore
        from jobplane.local.fake_gcs import FakeGcsServer

        with FakeGcsServer() as server:
            server.create_bucket("conformance")
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
            yield GcsStore("conformance")


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


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d", b"x")
    store.delete("d")
    store.delete("d")
    with pytest.raises(NotFound):
        store.get("d")


def test_cas_race_loses_no_update(store: ObjectStore) -> None:
    """16 threads x 50 compare-and-swap increments of one counter: exactly 800."""
    store.put("counter", b"0")
    threads, per_thread = 16, 50
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
    barrier = threading.Barrier(32)
    wins: list[int] = []

    def writer(n: int) -> None:
        barrier.wait()
        try:
            store.put_if_match("contended", str(n).encode(), version)
            wins.append(n)
        except PreconditionFailed:
            pass

    pool = [threading.Thread(target=writer, args=(n,)) for n in range(32)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(wins) == 1 and store.get("contended").data == str(wins[0]).encode()
