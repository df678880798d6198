"""A job's page over an in-memory registry (no browser): the state said once, events as readable lines, each
checkpoint and artifact a download the server streams from the job's own data (and nothing else), the TensorBoard
box's link, and an array member's array."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest

from jobplane import sdk
from jobplane.clouds.memory import MemoryCompute, MemoryStore
from jobplane.model import keys
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.helpers import data_of, member_store
from tests.ui.apps import TestClient, over, served

pytestmark = pytest.mark.timeout(60)
SPEC = "name: demo\ninstance_type: t3.micro\nrun: python train.py\n"


@pytest.fixture
def reg() -> Registry:
    return Registry(MemoryStore(), "root")


@pytest.fixture
def client(reg: Registry) -> TestClient:
    return served(over(reg, MemoryCompute))


def finished(reg: Registry, job_id: str, spec: str = SPEC) -> None:
    reg.create_job(job_id, parse_spec(spec, job_id))
    reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=["i-0abc", "i-0def"])
    reg.transition(job_id, State.RUNNING, expect=[State.LAUNCHING])
    reg.transition(job_id, State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0")


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_the_page_says_the_state_once_and_the_reason_once(reg: Registry, client: TestClient) -> None:
    finished(reg, "done")
    page = client.get("/jobs/done").text
    status = re.search(r'<section id="status".*?(?=<dl)', page, re.S)
    assert status is not None
    assert text(status.group(0)) == "SUCCEEDED every rank exited 0"
    assert "Reason:" not in page


def test_events_read_as_lines_not_python_values(reg: Registry, client: TestClient) -> None:
    finished(reg, "done")
    page = client.get("/jobs/done").text
    assert "['" not in page and "{'" not in page
    lines = [text(li) for li in re.findall(r'<li class="event.*?</li>', page, re.S)]
    assert [line[20:] for line in lines] == ["QUEUED (created)", "LAUNCHING attempt 1", "RUNNING attempt 1",
                                             "SUCCEEDED every rank exited 0 · attempt 1"], lines
    from jobplane.ui import data
    launched = data.timeline([{"time": "2026-11-22T12:00:00+00:00", "kind": "launched", "to": "LAUNCHING",
                               "attempt": 1, "instances": ["i-0abc", "i-0def"], "instance_type": "t3.micro",
                               "price": 0.0104, "zone": None, "tags": {"team": "vision"}}])
    assert launched[0]["detail"] == ("attempt 1 · instances i-0abc, i-0def · instance type t3.micro · "
                                     "price $0.0104/h · tags team vision")


def test_each_checkpoint_and_artifact_is_a_download_of_that_object(reg: Registry, client: TestClient) -> None:
    finished(reg, "done")
    folder = data_of(reg, "done")
    ckpt = "files/0/00000001-a1/ckpt 10.npz"
    reg.store.put(reg.key(keys.checkpoints_prefix(folder) + ckpt), b"weights" * 1000)
    reg.store.put(reg.key(keys.artifacts_prefix(folder) + "model/model.bin"), b"\x00model")
    page = client.get("/jobs/done").text
    link = f'/jobs/done/files/checkpoints/{quote(ckpt)}'
    assert f'href="{link}"' in page and 'href="/jobs/done/files/artifacts/model/model.bin"' in page
    got = client.get(link)
    assert got.status_code == 200 and got.content == b"weights" * 1000
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"] == "attachment; filename*=utf-8''ckpt%2010.npz"
    assert client.get("/jobs/done/files/artifacts/model/model.bin").content == b"\x00model"


def test_a_download_reaches_only_that_jobs_checkpoints_and_artifacts(reg: Registry, client: TestClient,
                                                                    tmp_path: Path) -> None:
    finished(reg, "done")
    finished(reg, "other")
    theirs = keys.checkpoints_prefix(data_of(reg, "other")) + "files/0/secret.bin"
    reg.store.put(reg.key(theirs), b"secret")
    reg.store.put(reg.key(keys.checkpoints_prefix(data_of(reg, "done")) + "files/0/a.bin"), b"mine")
    refused = ["checkpoints/../../other/checkpoints/files/0/secret.bin", "checkpoints/%2e%2e/%2e%2e/job.json",
               "checkpoints/files/0", "checkpoints/files//0/a.bin", "checkpoints/", "logs/1/0/0.log",
               "checkpoints/files/0/a.bin/", "checkpoints/files\\0\\a.bin"]
    for path in refused:
        answer = client.get(f"/jobs/done/files/{path}")
        assert answer.status_code == 404 and b"secret" not in answer.content and b"mine" not in answer.content, path
    assert client.get("/jobs/nope/files/checkpoints/files/0/a.bin").status_code == 404
    assert client.get("/jobs/done/files/checkpoints/files/0/a.bin").content == b"mine"
    job = over(reg, MemoryCompute).get("done")  # what a browser would normalise away, the SDK refuses too
    for path in ("./files/0/a.bin", "files/0/../0/a.bin", "/files/0/a.bin", "files/0/a.bin\n"):
        with pytest.raises(sdk.Refused, match="is not a path under the job's checkpoints/"):
            job.fetch("checkpoints", path, tmp_path / "got")
    assert not (tmp_path / "got").exists()


def test_a_team_member_cannot_download_another_teams_files(reg: Registry) -> None:
    finished(reg, "theirs")
    reg.store.put(reg.key(keys.artifacts_prefix(data_of(reg, "theirs")) + "model/m.bin"), b"theirs")
    member = served(over(Registry(member_store(reg.store, "team-a", root="root"), reg.root), MemoryCompute))
    answer = member.get("/jobs/theirs/files/artifacts/model/m.bin")
    assert answer.status_code == 403 and "belongs to default" in answer.text


def test_the_tensorboard_box_links_to_how_to_open_it(reg: Registry, client: TestClient) -> None:
    finished(reg, "boards", SPEC + "tensorboard: {log_dir: /opt/ml/output/tensorboard}\n")
    page = client.get("/jobs/boards").text
    assert '<a href="/tensorboard?id=boards" id="tensorboard-how">' in page
    how = client.get("/tensorboard", params=[("id", "boards"), ("id", "run-2"), ("id", "<bad>")]).text
    assert '<pre class="spec" id="tensorboard-command">jobplane tensorboard boards run-2</pre>' in how


def test_an_array_members_page_names_its_array_and_a_trials_its_sweep(reg: Registry, client: TestClient) -> None:
    member = SPEC + "array: {size: 3, index: 1}\nlabels: {array: shards}\n"
    finished(reg, "shards-1", member)
    page = client.get("/jobs/shards-1").text
    said = re.search(r'<p class="trial-of" id="member-of">.*?</p>', page, re.S)
    assert said is not None and text(said.group(0)) == "Member 1 of array shards (its members in the jobs table)"
    assert 'href="/?all=1&amp;label=array%3Dshards"' in said.group(0)
    members = client.get("/fragments/jobs", params={"all": "1", "label": "array=shards"}).text
    assert 'data-job="shards-1"' in members
    finished(reg, "lr-0", SPEC + "labels: {sweep: lr, trial: '0'}\n")
    trial = client.get("/jobs/lr-0").text
    assert re.search(r'id="member-of">Trial 0 of sweep <a href="/sweeps/lr">lr</a>', trial)
    finished(reg, "alone")
    assert 'id="member-of"' not in client.get("/jobs/alone").text
