"""A conditional write whose first try landed but whose response was lost: the SDK sends it again (botocore
retries a PUT up to 8 times; the GCS client retries too), and the resend fails its own precondition. The
registry must read that 412 as its own write, not as a lost race (F4): before, the launcher consumed the
drop and left the job LAUNCHING with no VM, and a check's transition landed but reported skipped, so the
end notification was never sent."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest

from jobplane.clouds.base import ObjectStore
from jobplane.clouds.gcs import GcsStore
from jobplane.clouds.memory import MemoryCompute
from jobplane.clouds.s3 import S3Store
from jobplane.control import launcher, reconcile
from jobplane.decide.model import Rule
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.model import keys, records
from jobplane.model.clock import utcnow
from jobplane.model.jobrecord import JobRecord
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.helpers import publish_agent_manifest
from tests.moto_aws import BUCKET, MotoAws

pytestmark = pytest.mark.timeout(120)
SPEC = "run: python3 train.py\ninstance_type: t3.micro\n"


class LostResponses:
    """The store behind a network that loses the response of every conditional write once: the request is
    sent again, as the SDK's retry does, and the cloud (moto, the GCS fake) answers the resend itself."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.resent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        self.inner.put_if_absent(key, data, content_type, tags)  # landed; the response is lost
        self.resent += 1
        return self.inner.put_if_absent(key, data, content_type, tags)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        self.inner.put_if_match(key, data, version, content_type)
        self.resent += 1
        return self.inner.put_if_match(key, data, version, content_type)


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    if request.param == "s3":
        moto: MotoAws = request.getfixturevalue("moto_aws")
        yield S3Store(BUCKET, moto.s3)
        return
    fake = FakeGcsServer()
    fake.start()
    fake.create_bucket(BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "jobplane-local")
    try:
        yield GcsStore(BUCKET)
    finally:
        fake.stop()


def test_a_resent_write_is_ours_the_job_launches_and_its_end_is_announced(store: ObjectStore) -> None:
    told: list[tuple[str, str]] = []
    publish_agent_manifest(Registry(store, "reg"), "aws")
    lossy = LostResponses(store)
    reg = Registry(lossy, "reg", listeners=[lambda old, new: told.append((old.state, new.state))])  # type: ignore[arg-type]
    compute, metrics = MemoryCompute(), CountingMetrics()
    key = keys.queue_entry("train", keys.DEFAULT_OWNER, "yaml")
    reg.put(key, SPEC.encode())

    outcome = launcher.handle_drop(Context(reg, compute, reg.policy(), metrics), key, now=utcnow())

    record: JobRecord = reg.job("train")
    assert outcome.result == "launched" and record.state == State.LAUNCHING and len(record.instances) == 1
    assert [r.job_id for r in compute.launches] == ["train"], "exactly one launch"
    assert lossy.resent >= 2, "the create and the claim were both resent"
    reg.put_json(keys.exit_report("train", 1, 0), records.ExitReport(code=0, instance_id=record.instances[0]).body())
    compute.reclaim(record.instances[0])
    (done,) = reconcile.check(Context(reg, compute, reg.policy(), metrics), now=utcnow() + timedelta(minutes=2),
                              jobs=["train"])
    assert (done.action.rule, done.result) == (Rule.FINISHED, "applied")
    assert reg.job("train").state == State.SUCCEEDED
    assert [new for _, new in told].count(State.SUCCEEDED) == 1, "announced once, by the run that made it"
    assert [e["kind"] for e in reg.events("train")].count("succeeded") == 1
