"""jobplane.sdk over a registry on each cloud (moto's S3 and EC2 in-process; the GCS and Compute Engine fakes):
naming a registry, submitting (a file, a mapping, a prepared spec; from 20 threads at once), finding and listing
jobs, waiting and following with a driver playing the launcher and agents, metrics, artifacts, cancelling, and
the typed errors. The CLI on top of it is tests/cli/; a real job through it, tests/local/test_sdk_notebook.py.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import count
from pathlib import Path

import pytest
import yaml

import jobplane
from jobplane import sdk
from jobplane.model import keys, metrics
from jobplane.model.metrics import Point
from jobplane.sdk import Client, State
from jobplane.store.registry import Registry
from tests.helpers import falling, publish, ship
from tests.registry_clouds import Driver, RegistryCloud, recorded

pytestmark = pytest.mark.timeout(120)


# ---- naming a registry --------------------------------------------------------------------------------------
def test_a_client_names_its_registry_as_the_cli_does(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBPLANE_BUCKET", "JOBPLANE_CLOUD", "JOBPLANE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(sdk.ConfigurationError, match="no registry bucket: set JOBPLANE_BUCKET"):
        Client()
    assert Client("b", cloud="gcp").url == "gs://b" and Client("s3://b", root="team").url == "s3://b/team"
    assert Client("gs://b/team").settings.root == "team" and Client("gs://b/team", root="team").cloud == "gcp"
    with pytest.raises(sdk.ConfigurationError, match="has the root 'team', not 'other'"):
        Client("s3://b/team", root="other")
    with pytest.raises(sdk.ConfigurationError, match="is on gcp, not aws"):
        Client("gs://b", cloud="aws")
    monkeypatch.setenv("JOBPLANE_BUCKET", "s3://from-env/root")
    assert repr(Client()) == "Client('s3://from-env/root')"
    assert jobplane.Client is Client


def test_what_a_deployment_runs_imports_jobplane_without_the_sdk() -> None:
    probe = "import sys, jobplane, jobplane.store.registry, jobplane.ops.jobs; print(sorted(m for m in sys.modules " \
            "if m.startswith(('jobplane.sdk', 'jobplane.ops.backend', 'jobplane.cli'))))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ---- submitting -----------------------------------------------------------------------------------------------
def test_submit_a_file_a_mapping_or_a_prepared_spec(
        registry_cloud: RegistryCloud, reg: Registry, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(registry_cloud.spec("hyperparameters: {epochs: 10}\nlabels: {team: nlp}\n"))
    client, uploaded = Client(), list[tuple[int, str]]()
    job = client.submit(spec, code=tmp_path / "src", hyperparameters={"lr": 0.02}, owner="nlp", id="from-file",
                        on_code=lambda files, uri: uploaded.append((files, uri)))
    assert (job.id, job.view.state, job.view.drop) == ("from-file", State.QUEUED, "queue/nlp/from-file.yaml")
    assert job.view.spec is not None and job.view.spec.hyperparameters == {"epochs": 10, "lr": 0.02}
    scheme = "gs" if registry_cloud.name == "gcp" else "s3"
    assert uploaded == [(1, f"{scheme}://jobplane-cli/{keys.code_upload('nlp', 'from-file')}")]

    as_mapping = yaml.safe_load(registry_cloud.spec())
    mapped = client.submit({**as_mapping, "name": "mapped"})
    assert mapped.id.startswith("mapped-") and client.get(mapped.id).state == State.QUEUED
    prepared = sdk.prepare(spec, id="prepared")
    assert client.submit(prepared).id == "prepared"
    with pytest.raises(sdk.Refused, match="'prepared' is already queued"):
        client.submit(prepared)

    assert [j.id for j in client.list(owner="nlp")] == ["from-file"]
    assert {j.id for j in client.list(label="team=nlp")} == {"from-file", "prepared"}
    assert [j.id for j in client.list(label={"team": "vision"})] == []
    assert len(client.list(state="QUEUED")) == 3 and client.list(state=[State.SUCCEEDED]) == []


def test_a_bad_spec_is_invalid_with_its_field_errors_before_anything_is_uploaded(
        registry_cloud: RegistryCloud, tmp_path: Path) -> None:
    client = Client()
    with pytest.raises(sdk.InvalidSpec) as bad:
        client.submit(yaml.safe_load(registry_cloud.spec()) | {"num_nodes": 0, "max_runtime": "soon"})
    assert sorted(e.path for e in bad.value.errors) == ["max_runtime", "num_nodes"]
    assert isinstance(bad.value, ValueError) and bad.value.source == "<spec>"
    other = "aws" if registry_cloud.name == "gcp" else "gcp"
    spec = yaml.safe_load(registry_cloud.spec()) | {"cloud": other}
    spec.pop("instance_type")
    with pytest.raises(sdk.InvalidSpec) as wrong_cloud:
        client.submit(spec | {"instance_type": "e2-small" if other == "gcp" else "t3.micro"}, code=tmp_path)
    assert [e.path for e in wrong_cloud.value.errors] == ["cloud"]
    assert "is not the cloud of the registry" in str(wrong_cloud.value)
    assert client.list(include_finished=True) == []
    with pytest.raises(sdk.InvalidSpec, match=r"code: .* is not a directory"):
        sdk.prepare(spec, code=tmp_path / "nowhere")


def test_twenty_submissions_from_threads_get_twenty_ids_each_with_its_own_code(
        registry_cloud: RegistryCloud, reg: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids are drawn from the name, the second and 4 hex digits: here the digits repeat on purpose, so threads in
    the same second draw the same ids. The client draws again for an id another thread is submitting, so no
    bundle is uploaded over another's."""
    drawn = count()
    monkeypatch.setattr("secrets.token_hex", lambda n: f"{next(drawn) // 3:04x}")  # each id drawn three times
    client = Client()
    spec = yaml.safe_load(registry_cloud.spec()) | {"name": "many"}

    def one(i: int) -> str:
        code = tmp_path / f"code-{i}"
        code.mkdir()
        (code / "which.txt").write_text(str(i))
        return f"{i}:{client.submit(spec, code=code).id}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        submitted = dict(s.split(":") for s in pool.map(one, range(20)))
    assert len(set(submitted.values())) == 20
    for i, job_id in submitted.items():
        with tarfile.open(fileobj=io.BytesIO(reg.get_bytes(keys.code_upload(keys.DEFAULT_OWNER, job_id)))) as tar:
            member = tar.extractfile("which.txt")
            assert member is not None and member.read().decode() == i, f"{job_id} has another job's code"
    assert sorted(j.id for j in client.list()) == sorted(submitted.values())


def test_a_drawn_id_a_finished_submission_took_is_drawn_again(registry_cloud: RegistryCloud, reg: Registry,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same second and the same 4 hex digits as a job already queued (by this process a moment ago, or by
    another): the id is drawn again, nothing is uploaded over the queued job's code. An id the caller gave is not."""
    digits = iter(["0000", "0000", "0001"])
    monkeypatch.setattr("secrets.token_hex", lambda n: next(digits))
    monkeypatch.setattr("jobplane.ops.jobs.utcnow", lambda: datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC))
    client = Client()
    spec = yaml.safe_load(registry_cloud.spec()) | {"name": "same"}
    first, second = client.submit(spec), client.submit(spec)
    assert (first.id, second.id) == ("same-1125-120005-0000", "same-1125-120005-0001")
    with pytest.raises(sdk.Refused, match="already queued"):
        client.submit(spec, id=first.id)


# ---- watching -------------------------------------------------------------------------------------------------
def test_wait_follow_logs_metrics_and_cancel(registry_cloud: RegistryCloud, reg: Registry) -> None:
    client = Client()
    job = client.submit(yaml.safe_load(registry_cloud.spec()), id="watched")
    driver = Driver(reg, "watched", None)  # takes it, runs it with one line of output, never ends it
    driver.start()
    statuses: list[str] = []
    assert job.wait(60, "running", interval=0.05, on_status=lambda s: statuses.append(s.text)) is State.RUNNING
    driver.finish()
    assert statuses and statuses[0].startswith("queued ")
    with pytest.raises(sdk.Timeout) as late:
        job.wait(0.2, interval=0.05)
    assert late.value.state == State.RUNNING and late.value.job_id == "watched" and isinstance(late.value, TimeoutError)
    lines = list(job.logs())
    assert lines == ["step 1 loss 0.5"] and (lines[0].attempt, lines[0].rank) == (1, 0)

    ship(reg, "watched", 1, 0, 0, falling(range(10, 60, 10)))
    loss = job.metrics()["loss"]
    assert loss.last < loss.points[0].value and loss.min == loss.last and loss.max == loss.points[0].value
    assert [p.step for p in loss.points] == [10, 20, 30, 40, 50] and list(job.metrics()) == ["step", "loss"]

    done = job.cancel()
    assert done.record.state == State.CANCELLED and not done.before_launch and job.view.state == State.CANCELLED
    with pytest.raises(sdk.Refused, match="already CANCELLED"):
        job.cancel()
    assert job.wait(1) is State.CANCELLED
    assert [e["kind"] for e in job.events()][-1] == "cancelled"


def test_logs_follow_yields_the_lines_as_they_come_then_the_final_state(
        registry_cloud: RegistryCloud, reg: Registry) -> None:
    client = Client()
    job = client.submit(yaml.safe_load(registry_cloud.spec()), id="streamed")
    driver = Driver(reg, "streamed", State.SUCCEEDED)
    driver.start()
    lines = [(str(line), line.attempt) for line in job.logs(follow=True, interval=0.05)]
    driver.finish()
    assert lines == [("step 1 loss 0.5", 1), ("step 2 loss 0.1", 1)]
    assert job.view.state == State.SUCCEEDED and job.reason == "every rank exited"


def test_artifacts_list_and_download(registry_cloud: RegistryCloud, reg: Registry, tmp_path: Path) -> None:
    recorded(registry_cloud, "made")
    publish(reg, "made", "model", {"result.json": b'{"loss": 0.01}'})
    publish(reg, "made", "output", {"log.txt": b"done"})
    job = Client().get("made")
    assert [(a.path, a.size) for a in job.artifacts()] == [("model/result.json", 14), ("output/log.txt", 4)]
    assert job.download(tmp_path, prefix="model/") == [tmp_path.resolve() / "model" / "result.json"]
    assert (tmp_path / "model" / "result.json").read_text() == '{"loss": 0.01}'
    assert not (tmp_path / "output").exists()


def test_an_unknown_job_is_job_not_found(registry_cloud: RegistryCloud) -> None:
    client = Client()
    with pytest.raises(sdk.JobNotFound) as missing:
        client.get("nope")
    assert str(missing.value) == "no job 'nope'" and missing.value.job_id == "nope"
    assert isinstance(missing.value, LookupError) and isinstance(missing.value, sdk.JobplaneError)


def test_a_metric_that_diverged_keeps_its_nan_last_and_finite_min_max(
        registry_cloud: RegistryCloud, reg: Registry) -> None:
    recorded(registry_cloud, "nan")
    ship(reg, "nan", 1, 0, 0, [Point("loss", 2.0, 1), Point("loss", 1.0, 2), Point("loss", float("nan"), 3)])
    loss = Client().get("nan").metrics()["loss"]
    assert str(loss.last) == "nan" and (loss.min, loss.max) == (1.0, 2.0) and "last=nan" in repr(loss)
    assert metrics.STEP not in Client().get("nan").metrics()


def test_a_client_and_its_jobs_are_shared_by_threads(registry_cloud: RegistryCloud, reg: Registry) -> None:
    """The Compute adapter is made once, whichever thread asks first."""
    recorded(registry_cloud, "shared")
    client, seen = Client(), list[int]()
    barrier = threading.Barrier(6)

    def look() -> None:
        barrier.wait()
        seen.append(len(client.get("shared").instances()))

    threads = [threading.Thread(target=look) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == [0] * 6
