"""A team member's GCS calls, as the GCS fake holds a token member-<owner> to what infra/gcp grants
submitters[<owner>] (jobplane.local.gcp_grants): the CLI's store carries the token JOBPLANE_GCS_TOKEN names, reads
every team's records and only its own team's data, creates only in its owner's folders, and lists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobplane.clouds.base import AccessDenied
from jobplane.clouds.gcs import GcsStore
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.local.gcp import GcpLocalCloud
from jobplane.model import keys
from jobplane.ops import backend, jobs
from jobplane.settings import Settings
from jobplane.store.registry import Registry

pytestmark = pytest.mark.timeout(120)
BUCKET, ROOT = "jobplane-members", "reg"
OWN, OTHER = keys.JobData("x", "team-a"), keys.JobData("y", "team-b")
OWN_LOG, OTHER_LOG = keys.log_chunk(OWN, 1, 0, 1), keys.log_chunk(OTHER, 1, 0, 1)


@pytest.fixture(scope="module")
def gcs() -> Iterator[FakeGcsServer]:
    fake = FakeGcsServer(member_registry=f"{BUCKET}/{ROOT}")
    fake.start()
    try:
        fake.create_bucket(BUCKET)
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def member(gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The registry as the CLI and SDK open it for a member of team-a, after the platform wrote what it reads."""
    gcs.reset()
    gcs.create_bucket(BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    platform = Registry(GcsStore(BUCKET, project="p"), ROOT)  # no token: unenforced, as the functions
    for key in (keys.job_record("x"), OWN_LOG, OTHER_LOG, keys.code_upload("team-b", "y"), keys.POLICY):
        platform.put(key, b"{}")
    settings = Settings.from_env(environ={"JOBPLANE_BUCKET": f"gs://{BUCKET}/{ROOT}", "GOOGLE_CLOUD_PROJECT": "p",
                                          "JOBPLANE_GCS_TOKEN": "member-team-a"})
    return backend.registry(settings)


def test_a_member_reads_the_records_and_its_own_teams_data_only(member: Registry) -> None:
    assert member.get_bytes(keys.job_record("x")) == b"{}"
    assert member.get_bytes(OWN_LOG) == b"{}" and member.get_bytes(keys.POLICY) == b"{}"
    for key in (OTHER_LOG, keys.code_upload("team-b", "y")):
        with pytest.raises(AccessDenied):
            member.get_bytes(key)


def test_a_member_creates_only_in_its_owners_folders_and_overwrites_nothing(member: Registry) -> None:
    member.put_if_absent(keys.queue_entry("x", "team-a"), b"id: x\n", "application/yaml")
    member.put_if_absent(keys.cancel_request("team-a", "x"), b"")
    for key in (keys.job_record("x"), keys.cancel_request("team-b", "x"), keys.log_chunk(OWN, 1, 0, 2),
                keys.queue_entry("z", "team-b")):
        with pytest.raises(AccessDenied):
            member.put(key, b"{}")
    with pytest.raises(AccessDenied):  # create-only: an overwrite needs delete, which no member holds
        member.put(keys.queue_entry("x", "team-a"), b"id: x\n")


def test_a_member_lists_the_registry(member: Registry) -> None:
    assert list(member.folders(keys.JOBS)) == ["jobs/x/"]
    # names only, every team's: GCS checks a listing on the bucket, which no condition on object names scopes
    assert [key for key, _, _ in member.listing(keys.TEAMS)] == [OWN_LOG, OTHER_LOG]


def test_submit_as_a_member_drops_the_spec_and_its_code_in_its_owners_folders(member: Registry,
                                                                            tmp_path: Path) -> None:
    settings = Settings.from_env(environ={"JOBPLANE_BUCKET": f"gs://{BUCKET}/{ROOT}", "GOOGLE_CLOUD_PROJECT": "p",
                                          "JOBPLANE_GCS_TOKEN": "member-team-a"})
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    doc = {"id": "new-job", "cloud": "gcp", "instance_type": "n2-standard-4", "command": "python train.py"}
    jobs.submit(backend.connect(settings), jobs.Submission("new-job", doc, tmp_path / "src", "team-a"))
    assert member.has(keys.queue_entry("new-job", "team-a")) and member.has(keys.code_upload("team-a", "new-job"))
    with pytest.raises(AccessDenied):  # the same, for another team
        jobs.submit(backend.connect(settings), jobs.Submission("other-job", doc, None, "team-b"))


def test_the_local_gcp_cloud_starts_its_gcs_fake_granting_members(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake in its own process, as `jobplane local up --cloud gcp` starts it; member_exports' token reaches
    its team's folders only."""
    cloud = GcpLocalCloud(tmp_path / "state")
    cloud.state_dir.mkdir(parents=True)
    cloud.gcs.start(tmp_path / "gcs.log")
    cloud.compute.start()
    try:
        exports = cloud.member_exports("team-a")
        assert exports["JOBPLANE_GCS_TOKEN"] == "member-team-a" and exports["JOBPLANE_OWNER"] == "team-a"
        assert exports.items() >= cloud.exports.items()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", exports["STORAGE_EMULATOR_HOST"])
        reg = backend.registry(Settings.from_env(environ=exports))
        reg.put_if_absent(keys.queue_entry("x", "team-a"), b"id: x\n", "application/yaml")
        with pytest.raises(AccessDenied):
            reg.put_if_absent(keys.queue_entry("x", "team-b"), b"id: x\n", "application/yaml")
        with pytest.raises(ValueError, match="not an owner name"):
            cloud.member_exports("Team A")
    finally:
        cloud.compute.stop()
        cloud.gcs.stop()
