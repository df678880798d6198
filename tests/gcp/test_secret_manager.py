"""Secrets on GCP: clouds/gcp_secrets.py over the local cloud's Secret Manager fake (jobplane.local.fake_secrets),
which holds each caller to the grants infra/gcp gives (tests/gcp/test_terraform.py holds the module to them): the
platform team sets, rotates (the old version destroyed) and reads; a team member sets and deletes only its own
team's and reads no value; any other token (a job's downscoped one, a VM's) reaches nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from google.auth.transport.requests import AuthorizedSession

from jobplane.clouds.base import AccessDenied
from jobplane.clouds.gcp_secrets import SecretManager, secret_id
from jobplane.clouds.gcs import access_token_credentials
from jobplane.local.fake_secrets import FakeSecretManager
from jobplane.model.secrets import MAX_VALUE, SecretMissing

DEPLOYMENT = "registry-bucket"


@pytest.fixture
def fake() -> Iterator[FakeSecretManager]:
    with FakeSecretManager() as server:
        yield server


def as_(fake: FakeSecretManager, token: str) -> SecretManager:
    session = AuthorizedSession(access_token_credentials(token))  # type: ignore[no-untyped-call]
    return SecretManager(session, "proj", DEPLOYMENT, fake.url)


def test_who_sets_rotates_lists_and_reads_a_secret(fake: FakeSecretManager) -> None:
    platform, member, job = (as_(fake, t) for t in ("jobplane-local-platform", "member-team-s", "downscoped-abc"))
    big = os.urandom(MAX_VALUE)
    platform.put("team-s", "hf-token", big)
    assert platform.get("team-s", "hf-token") == big
    member.put("team-s", "hf-token", b"rotated")  # its own team's: a new version, the old one destroyed
    assert platform.get("team-s", "hf-token") == b"rotated"
    versions = fake._secrets[secret_id(DEPLOYMENT, "team-s", "hf-token")]["versions"]
    assert [v["state"] for v in versions] == ["DESTROYED", "ENABLED"] and versions[0]["data"] == ""
    with pytest.raises(AccessDenied):
        member.get("team-s", "hf-token")  # a person never reads a value
    with pytest.raises(AccessDenied):
        member.put("team-t", "hf-token", b"x")  # nor writes another team's
    with pytest.raises(AccessDenied):
        job.get("team-s", "hf-token")  # a job's own token reaches Cloud Storage only: vend hands it its secrets
    platform.put("team-t", "wandb", b"w")
    assert [(s.owner, s.name) for s in member.list()] == [("team-s", "hf-token"), ("team-t", "wandb")]
    assert [s.name for s in member.list("team-s")] == ["hf-token"] and member.list()[0].set_at is not None
    assert member.delete("team-s", "hf-token") and not member.delete("team-s", "hf-token")
    with pytest.raises(SecretMissing):
        platform.get("team-s", "hf-token")
