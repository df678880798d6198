"""The GCE metadata client against the fake metadata server (and the fake as the Compute fake binds it)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from jobplane.agent.cli import cloud_adapters, parse_args
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED, LaunchRequest
from jobplane.clouds.gce_metadata import GceMetadata, MetadataError
from jobplane.clouds.gcp import GceCompute
from tests.gcp.fakes import ComputeFake, MetadataFake

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[MetadataFake]:
    fake = MetadataFake(name="train-1-a2-0003", zone="us-central1-b",
                                 attributes={"jobplane-job-id": "train-1", "jobplane-attempt": "2"})
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def test_identity_tags_and_rank_from_the_name(server: MetadataFake) -> None:
    md = GceMetadata(server.base_url)
    assert md.instance_id() == "us-central1-b/train-1-a2-0003"
    assert (md.tag(TAG_JOB_ID), md.tag(TAG_ATTEMPT), md.tag(TAG_MANAGED)) == ("train-1", "2", None)
    assert md.rank() == 2  # bulk-inserted VMs are numbered from 1 in rank order
    server.attributes["jobplane-rank"] = "5"
    assert GceMetadata(server.base_url).rank() == 5  # an explicit attribute wins


def test_the_agent_takes_the_server_from_gce_metadata_host(server: MetadataFake,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", server.host)
    _, metadata, _, _ = cloud_adapters(parse_args(["--cloud", "gcp", "--bucket", "b"]))
    assert metadata.instance_id() == "us-central1-b/train-1-a2-0003"
    assert GceMetadata(host=server.host).instance_id() == "us-central1-b/train-1-a2-0003"


def test_requests_without_the_flavor_header_are_refused(server: MetadataFake) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.base_url + "instance/id", timeout=5)
    assert err.value.code == 403


def test_preemption_notice_appears_once_preempted(server: MetadataFake) -> None:
    md = GceMetadata(server.base_url)
    assert md.preemption_notice() is None
    server.set_preempted()
    notice = md.preemption_notice()
    assert notice is not None and notice["action"] == "terminate" and notice["time"]


def test_wait_for_preemption_blocks_on_the_server_until_the_notice(server: MetadataFake) -> None:
    md = GceMetadata(server.base_url)
    started = time.monotonic()
    assert md.wait_for_preemption(timeout=1) is None
    assert time.monotonic() - started >= 0.9  # held by the server, not polled
    timer = threading.Timer(0.3, server.set_preempted)
    timer.start()
    requests_before = server.requests
    notice = md.wait_for_preemption(timeout=20)
    timer.join()
    assert notice is not None and server.requests - requests_before == 2  # one look, one long wait


def test_an_unreachable_server_is_a_metadata_error() -> None:
    with pytest.raises(MetadataError):
        GceMetadata("http://127.0.0.1:9/computeMetadata/v1/", timeout=0.5).instance_id()


def test_compute_fake_serves_each_vm_its_own_metadata(compute_fake: ComputeFake, gce: GceCompute) -> None:
    instances = gce.launch(LaunchRequest(job_id="pair", attempt=3, num_nodes=2, instance_type="n2-standard-4",
                                         zone="us-central1-a", image="img", spot=True, user_data="#!/bin/bash\n",
                                         max_runtime=600, disk_gb=20, owner="bob"))
    for inst in instances:
        md = GceMetadata(compute_fake.metadata_server(inst.id).base_url)
        assert md.instance_id() == inst.id and md.rank() == inst.rank
        assert (md.tag(TAG_JOB_ID), md.tag(TAG_ATTEMPT), md.tag(TAG_MANAGED)) == ("pair", "3", "true")
        assert md.private_ip() == inst.private_ip
    watcher = GceMetadata(compute_fake.metadata_server(instances[1].id).base_url)
    compute_fake.preempt(instances[1].id, notice_only=True)
    assert watcher.preemption_notice() is not None
    assert len(gce.list_managed()) == 2  # notice only: the VM is still there for its ~30 s


def test_artifact_registry_is_logged_in_to_with_the_vms_token_and_others_anonymously(server: MetadataFake) -> None:
    md = GceMetadata(server.base_url)
    user, password = md.registry_login("us-central1-docker.pkg.dev") or ("", "")
    assert user == "oauth2accesstoken" and password and password == md.registry_login("gcr.io")[1]  # type: ignore[index]
    assert md.registry_login("docker.io") is None and md.registry_login("ghcr.io") is None
    assert md.registry_login("127.0.0.1:5000") is None
