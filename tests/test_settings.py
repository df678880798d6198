"""Where the registry is: a URL's scheme says the cloud, its path the root; a bare name takes the cloud given."""

from __future__ import annotations

import pytest

from jobplane.settings import Settings


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBPLANE_BUCKET", "JOBPLANE_ROOT", "JOBPLANE_CLOUD", "JOBPLANE_REGION", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)


def test_urls_name_cloud_bucket_and_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBPLANE_ROOT", "from-env")
    assert Settings.from_env("gs://reg/team/a/") == Settings("reg", "team/a", None, "gcp")
    assert Settings.from_env("s3://reg") == Settings("reg", "from-env", None, "aws")
    assert Settings.from_env("gs://reg").url == "gs://reg" and Settings.from_env("s3://reg").url == "s3://reg"


def test_a_bare_name_takes_the_cloud_given_else_the_environment_else_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env("reg").cloud == "aws"
    assert Settings.from_env("reg", "gcp").cloud == "gcp"
    monkeypatch.setenv("JOBPLANE_CLOUD", "gcp")
    assert Settings.from_env("reg").cloud == "gcp"
    assert Settings.from_env("s3://reg").cloud == "aws"  # the URL's scheme beats the environment


def test_regions_per_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert Settings.from_env("s3://reg").region == "eu-west-1"
    assert Settings.from_env("gs://reg").region is None  # an AWS variable says nothing about GCP
    monkeypatch.setenv("JOBPLANE_REGION", "us-central1")
    assert Settings.from_env("gs://reg").region == "us-central1"
    assert Settings.from_env("gs://reg", region="europe-west4").region == "europe-west4"


@pytest.mark.parametrize(("named", "cloud", "message"), [
    ("", None, "no registry bucket"),
    ("az://reg", None, r"s3://BUCKET\[/ROOT\] or gs://BUCKET\[/ROOT\]"),
    ("gs://", None, "no bucket name"),
    ("gs://reg", "aws", "is on gcp, not aws"),
    ("reg", "azure", "unknown cloud 'azure'"),
])
def test_bad_registries_say_what_is_wrong(named: str, cloud: str | None, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        Settings.from_env(named or None, cloud)
