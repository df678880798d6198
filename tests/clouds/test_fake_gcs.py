"""The GCS fake, driven by the real google-cloud-storage client: it must answer 412 wherever GCS would."""

from __future__ import annotations

import io
from typing import Any

import pytest

from jobplane.local.fake_gcs import FakeGcsServer

pytestmark = pytest.mark.timeout(60)

storage = pytest.importorskip("google.cloud.storage")
api_errors = pytest.importorskip("google.api_core.exceptions")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> FakeGcsServer:
    fake = FakeGcsServer()
    fake.start()
    request.addfinalizer(fake.stop)
    fake.create_bucket("b")
    return fake


@pytest.fixture
def bucket(server: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)  # anonymous credentials, no real GCS
    return storage.Client(project="test").bucket("b")


def test_create_only_twice_is_412(bucket: Any) -> None:
    bucket.blob("k").upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(api_errors.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"second", if_generation_match=0)
    assert bucket.blob("k").download_as_bytes() == b"first"


def test_stale_generation_is_412(bucket: Any) -> None:
    first = bucket.blob("k")
    first.upload_from_string(b"1")
    second = bucket.blob("k")
    second.upload_from_string(b"2", if_generation_match=first.generation)
    assert second.generation > first.generation  # strictly increasing
    with pytest.raises(api_errors.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"3", if_generation_match=first.generation)
    with pytest.raises(api_errors.PreconditionFailed):  # a missing object has generation 0
        bucket.blob("absent").upload_from_string(b"x", if_generation_match=first.generation)
    blob = bucket.blob("k")
    assert blob.download_as_bytes() == b"2" and blob.generation == second.generation


def test_delete_with_wrong_generation_is_412(bucket: Any) -> None:
    blob = bucket.blob("k")
    blob.upload_from_string(b"x")
    with pytest.raises(api_errors.PreconditionFailed):
        bucket.blob("k").delete(if_generation_match=blob.generation - 1)
    assert bucket.get_blob("k") is not None
    bucket.blob("k").delete(if_generation_match=blob.generation)
    assert bucket.get_blob("k") is None
    with pytest.raises(api_errors.NotFound):
        bucket.blob("k").delete()


def test_list_pages_of_two_return_all_five_in_order(bucket: Any) -> None:
    for name in ["p/4", "p/2", "p/0", "p/3", "p/1", "q/other"]:
        bucket.blob(name).upload_from_string(name.encode())
    pages = [
        [blob.name for blob in page]
        for page in bucket.client.list_blobs(bucket, prefix="p/", page_size=2).pages
    ]
    assert pages == [["p/0", "p/1"], ["p/2", "p/3"], ["p/4"]]
    listed = list(bucket.client.list_blobs(bucket, prefix="p/", start_offset="p/2"))
    assert [(b.name, b.size, b.updated.tzinfo is not None) for b in listed] == [
        (f"p/{i}", 3, True) for i in (2, 3, 4)
    ]


def test_list_with_delimiter_collapses_prefixes_across_pages(bucket: Any) -> None:
    for name in ["a/1", "a/2", "b", "c/1", "d"]:
        bucket.blob(name).upload_from_string(b"")
    iterator = bucket.client.list_blobs(bucket, delimiter="/", page_size=1)
    assert [blob.name for blob in iterator] == ["b", "d"]
    assert iterator.prefixes == {"a/", "c/"}


def test_download_of_missing_object_is_404(bucket: Any) -> None:
    with pytest.raises(api_errors.NotFound):
        bucket.blob("nope").download_as_bytes()
    assert bucket.get_blob("nope") is None


def test_download_honours_generation_and_conditions(bucket: Any) -> None:
    old = bucket.blob("k")
    old.upload_from_string(b"old")
    new = bucket.blob("k")
    new.upload_from_string(b"new")
    with pytest.raises(api_errors.PreconditionFailed):
        bucket.blob("k").download_as_bytes(if_generation_match=old.generation)
    with pytest.raises(api_errors.NotFound):  # no versioning: the old generation is gone
        bucket.blob("k", generation=old.generation).download_as_bytes()
    with pytest.raises(api_errors.NotModified):
        bucket.blob("k").download_as_bytes(if_generation_not_match=new.generation)
    pinned = bucket.blob("k", generation=new.generation)
    assert pinned.download_as_bytes(if_metageneration_match=1) == b"new"


def test_names_with_slashes_escapes_and_unicode_round_trip(bucket: Any) -> None:
    name = "jobs/a b/é%2F?#x"
    bucket.blob(name).upload_from_string(b"data", content_type="application/json")
    blob = bucket.get_blob(name)
    assert blob.name == name and blob.content_type == "application/json" and blob.size == 4
    assert bucket.blob(name).download_as_bytes() == b"data"
    assert [b.name for b in bucket.client.list_blobs(bucket, prefix="jobs/")] == [name]


def test_resumable_upload_checks_preconditions_when_it_completes(bucket: Any) -> None:
    data = bytes(range(256)) * 2600  # ~650 KiB in three 256 KiB chunks
    blob = bucket.blob("big", chunk_size=256 * 1024)
    blob.upload_from_file(io.BytesIO(data), if_generation_match=0)  # no size: the client goes resumable
    assert bucket.blob("big").download_as_bytes() == data
    with pytest.raises(api_errors.PreconditionFailed):
        bucket.blob("big", chunk_size=256 * 1024).upload_from_file(io.BytesIO(data), if_generation_match=0)


def test_buckets_and_reset(server: FakeGcsServer, bucket: Any) -> None:
    client = bucket.client
    client.create_bucket("made-by-client")
    with pytest.raises(api_errors.Conflict):
        client.create_bucket("made-by-client")
    assert client.get_bucket("made-by-client").name == "made-by-client"
    bucket.blob("k").upload_from_string(b"x")
    server.reset()
    with pytest.raises(api_errors.NotFound):
        client.get_bucket("b")


def test_stop_is_idempotent_and_context_manager_stops() -> None:
    with FakeGcsServer() as fake:
        assert fake.endpoint.startswith("http://127.0.0.1:")
    with pytest.raises(RuntimeError):
        _ = fake.endpoint
    fake.stop()


def test_range_reads_serve_slices_and_refuse_ranges_past_the_end(server: FakeGcsServer, bucket: Any) -> None:
    bucket.blob("k").upload_from_string(b"0123456789")
    assert bucket.blob("k").download_as_bytes(start=2, end=5) == b"2345"
    assert bucket.blob("k").download_as_bytes(start=7) == b"789"
    assert server.served["k"][-2:] == [4, 3]  # the fake records what each response carried
    with pytest.raises(api_errors.GoogleAPIError):
        bucket.blob("k").download_as_bytes(start=20, end=30)


def test_injected_failures_are_retried_by_the_client(server: FakeGcsServer, bucket: Any) -> None:
    bucket.blob("k").upload_from_string(b"data")
    server.fail_next("download", 2)
    assert bucket.blob("k").download_as_bytes() == b"data"  # 503 twice, then served
    assert server.faults_pending() == 0
