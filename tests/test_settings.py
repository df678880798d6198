"""Where the registry is: a URL's scheme says the cloud, its path the root; a bare name takes the cloud given."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jobplane
from jobplane.settings import Settings


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBPLANE_BUCKET", "JOBPLANE_ROOT", "JOBPLANE_CLOUD", "JOBPLANE_REGION", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "JOBPLANE_NOTIFY_TOPIC", "GOOGLE_CLOUD_PROJECT", "JOBPLANE_COMPUTE_ENDPOINT",
                 "PUBSUB_EMULATOR_HOST", "JOBPLANE_VEND_URL", "JOBPLANE_GCS_TOKEN"):
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


# The modules that may read the process environment: settings, and the entry points (the CLI, the agent's,
# the VM's startup script, the local cloud's processes). Everything else takes what it needs as arguments.
ENV_READERS = ("settings.py", "cli/", "agent/cli.py", "boot/bootstrap.py", "local/")


ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_reads(source: str) -> list[int]:
    """Lines that use os.environ / os.getenv / os.putenv, or import one of them from os."""
    def reads(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr in ENV_NAMES
        return isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in ENV_NAMES for a in node.names)

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if reads(node))


def test_only_settings_and_the_entry_points_read_the_environment() -> None:
    package = Path(jobplane.__file__).parent
    readers = {str(path.relative_to(package)): lines for path in sorted(package.rglob("*.py"))
               if not str(path.relative_to(package)).startswith(ENV_READERS)
               and (lines := environment_reads(path.read_text()))}
    assert readers == {}, f"environment reads outside settings and the entry points (module: lines): {readers}"


def test_the_scan_sees_every_way_of_reading() -> None:
    source = "import os\nfrom os import getenv\na = os.environ['A']\nb = os.getenv('B')\nc = dict(os.environ)\n"
    assert environment_reads(source) == [2, 3, 4, 5]
    assert environment_reads("import os\nos.path.join('a', 'b')\nos.cpu_count()\n") == []


def test_a_mapping_given_is_read_instead_of_the_process_environment() -> None:
    environ = {"JOBPLANE_BUCKET": "gs://reg/team", "JOBPLANE_REGION": "europe-west4",
               "GOOGLE_CLOUD_PROJECT": "proj", "JOBPLANE_NOTIFY_TOPIC": "projects/proj/topics/jobs",
               "JOBPLANE_COMPUTE_ENDPOINT": "http://127.0.0.1:9", "PUBSUB_EMULATOR_HOST": "127.0.0.1:8",
               "JOBPLANE_VEND_URL": "http://127.0.0.1:7/vend"}
    assert Settings.from_env(environ=environ) == Settings(
        "reg", "team", "europe-west4", "gcp", notify_topic="projects/proj/topics/jobs", project="proj",
        compute_endpoint="http://127.0.0.1:9", pubsub_emulator="127.0.0.1:8", vend_url="http://127.0.0.1:7/vend")
    assert Settings.from_env(environ={"JOBPLANE_BUCKET": "reg"}) == Settings("reg")


def test_a_gcs_token_is_read_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `gcloud auth print-access-token` prints, for a person whose GCS calls carry their own identity."""
    monkeypatch.setenv("JOBPLANE_GCS_TOKEN", "ya29.secret")
    settings = Settings.from_env("gs://reg")
    assert settings.gcs_token == "ya29.secret" and "ya29" not in repr(settings)
    assert Settings.from_env(environ={"JOBPLANE_BUCKET": "gs://reg", "JOBPLANE_GCS_TOKEN": ""}).gcs_token is None
