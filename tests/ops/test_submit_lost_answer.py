"""A drop's create-only write whose answer is lost (a 5xx after it took effect, as `local up --faults` and S3 do)
is retried by the SDK's client and then finds the object: submit takes its own drop as written instead of saying the
job is already queued (the faults scenario met this), and still refuses a drop of the same id it did not write."""

from __future__ import annotations

from typing import Any

import pytest

from jobplane.clouds.base import PreconditionFailed
from jobplane.clouds.memory import MemoryStore
from jobplane.model import keys
from jobplane.ops import jobs
from jobplane.store.registry import Registry


class LostAnswers(MemoryStore):
    """put_if_absent writes, then answers as the retry of a write whose first answer was lost does."""

    def put_if_absent(self, key: str, data: bytes, *args: Any, **kwargs: Any) -> None:
        super().put_if_absent(key, data, *args, **kwargs)
        raise PreconditionFailed(key)


def backend(store: MemoryStore) -> jobs.Backend:
    def no_compute(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("submit asks no VM API")

    return jobs.Backend(Registry(store, "root"), "s3://bucket/root", no_compute, lambda key, path: None)


def test_a_retried_drop_that_finds_its_own_write_is_submitted() -> None:
    store = LostAnswers()
    doc = {"id": "lost-1", "instance_type": "t3.micro", "run": "python3 train.py"}
    view = jobs.submit(backend(store), jobs.Submission("lost-1", doc, None))
    assert view.id == "lost-1" and view.state == "QUEUED"
    assert Registry(store, "root").has(keys.queue_entry("lost-1", keys.DEFAULT_OWNER))


class Raced(MemoryStore):
    """Another submit's drop of the same id lands between submit's check and its write."""

    def put_if_absent(self, key: str, data: bytes, *args: Any, **kwargs: Any) -> None:
        super().put_if_absent(key, b"id: taken-1\nrun: someone else's\n", *args, **kwargs)
        super().put_if_absent(key, data, *args, **kwargs)


def test_a_drop_of_the_same_id_it_did_not_write_is_still_refused() -> None:
    store = Raced()
    doc = {"id": "taken-1", "instance_type": "t3.micro", "run": "python3 train.py"}
    with pytest.raises(jobs.JobError, match="already queued"):
        jobs.submit(backend(store), jobs.Submission("taken-1", doc, None))
    assert Registry(store, "root").get_bytes(keys.queue_entry("taken-1", keys.DEFAULT_OWNER)) == \
        b"id: taken-1\nrun: someone else's\n"
