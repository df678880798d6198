"""The Compare page over an in-memory registry of 1,000 jobs (no browser): jobs found by search, sweep, array or
label (never a queued or INVALID one), the metric picked from those the chosen jobs have, and no job's metrics read
before it is chosen."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from jobplane.clouds.memory import MemoryCompute, MemoryStore
from jobplane.model import keys
from jobplane.model.metrics import Point
from jobplane.model.spec import parse_spec
from jobplane.store.registry import Registry
from tests.helpers import ship
from tests.ui.apps import TestClient, over, served

pytestmark = pytest.mark.timeout(120)
JOBS = 1000
SPEC = "name: {name}\ninstance_type: t3.micro\nrun: python train.py\nlabels: {labels}\n"


class Counted(MemoryStore):
    """A MemoryStore that keeps the keys it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[str] = []

    def get(self, key: str):  # type: ignore[no-untyped-def]
        self.got.append(key)
        return super().get(key)


@pytest.fixture(scope="module")
def store() -> Counted:
    """1,000 recorded jobs, each with a loss and an accuracy: a sweep `lr` of 8 trials (one also prints `bleu`),
    an array `shards` of 4 members, the rest labelled team=vision or team=nlp; a drop still queued and an INVALID
    one."""
    store = Counted()
    reg = Registry(store, "root")
    for i in range(JOBS):
        if i < 8:
            job_id, labels = f"lr-{i}", f"{{sweep: lr, trial: '{i}'}}"
        elif i < 12:
            job_id, labels = f"shards-{i - 8}", "{array: shards}"
        else:
            job_id, labels = f"job-{i:04d}", "{team: %s}" % ("vision" if i % 2 else "nlp")
        spec = SPEC.format(name=f"run{i}", labels=labels)
        if job_id.startswith("shards"):
            spec += f"array: {{size: 4, index: {i - 8}}}\n"
        reg.create_job(job_id, parse_spec(spec, job_id))
        points = [Point("loss", 1.0 / (s + 1) + i / 1000, s) for s in range(5)] + [Point("accuracy", 0.5, 4)]
        ship(reg, job_id, 1, 0, 0, points + ([Point("bleu", 20.0 + i, 4)] if i == 3 else []))
    reg.store.put(reg.key(keys.queue_entry("queued-1")), SPEC.format(name="q", labels="{}").encode())
    reg.store.put(reg.key(keys.rejected_spec("broken-1")), b"name: [")
    reg.store.put(reg.key(keys.rejected_error("broken-1")), b'{"errors": ["bad yaml"]}')
    return store


@pytest.fixture(scope="module")
def client(store: Counted) -> Iterator[TestClient]:
    yield served(over(Registry(store, "root"), MemoryCompute))


def metric_reads(store: Counted) -> set[str]:
    """The jobs whose metric chunks were read since the last call."""
    read = {m.group(1) for key in store.got if (m := re.search(r"/([^/]+)/metrics/", key))}
    store.got.clear()
    return read


def listed(page: str) -> list[str]:
    found = re.search(r'<div class="pick" id="matches">(.*?)</div>', page, re.S)
    assert found is not None
    return re.findall(r'<label data-job="([^"]+)">', found.group(1))


def test_the_page_lists_matches_without_reading_any_jobs_metrics(client: TestClient, store: Counted) -> None:
    client.get("/compare")  # the first view reads every record, as the jobs page's does
    metric_reads(store)
    started = time.perf_counter()
    page = client.get("/compare").text
    took = time.perf_counter() - started
    assert metric_reads(store) == set() and took < 2.0, took
    assert f"{JOBS} jobs match; the newest 50 are listed" in page and len(listed(page)) == 50
    assert "queued-1" not in page and "broken-1" not in page  # no metrics to compare
    every = client.get("/", params={"all": "1", "q": "-1"}).text  # which the jobs table lists
    assert 'data-job="queued-1"' in every and 'data-job="broken-1"' in every
    assert re.search(r'<select name="sweep"[^>]*><option value="">any</option><option>lr</option></select>', page)
    assert re.search(r'<select name="array"[^>]*><option value="">any</option><option>shards</option></select>', page)


def test_a_filter_finds_a_sweeps_trials_an_arrays_members_a_label_or_text(client: TestClient) -> None:
    assert sorted(listed(client.get("/compare", params={"sweep": "lr"}).text)) == [f"lr-{i}" for i in range(8)]
    assert sorted(listed(client.get("/compare", params={"array": "shards"}).text)) == [f"shards-{i}" for i in range(4)]
    nlp = client.get("/compare", params={"label": "team=nlp", "q": "run99"}).text
    assert sorted(listed(nlp)) == ["job-0990", "job-0992", "job-0994", "job-0996", "job-0998"]
    assert "5 jobs match." in nlp


def test_comparing_a_sweep_reads_only_its_trials_and_offers_their_metrics(client: TestClient, store: Counted) -> None:
    metric_reads(store)
    page = client.get("/compare", params={"sweep": "lr", "add": "all"}).text
    assert metric_reads(store) == {f"lr-{i}" for i in range(8)}
    chosen = re.findall(r'<input type="checkbox" name="id" value="([^"]+)" checked', page)
    assert sorted(chosen) == [f"lr-{i}" for i in range(8)] and listed(page) == []
    options = re.findall(r'<option value="([^"]+)"( selected)?>[^<]*\((\d+) of 8\)</option>', page)
    assert options == [("accuracy", " selected", "8"), ("loss", "", "8"), ("bleu", "", "1")]
    loss = client.get("/compare", params=[*(("id", f"lr-{i}") for i in range(8)), ("metric", "loss")]).text
    embedded = re.search(r'<script type="application/json" id="compare-data">(.*?)</script>', loss, re.S)
    assert embedded is not None and '"metric": "loss"' in embedded.group(1)
    assert '"x": [0.0, 1.0, 2.0, 3.0, 4.0]' in embedded.group(1)
    assert 'href="/tensorboard?id=lr-0&amp;id=lr-1' in loss


def test_at_most_twenty_jobs_are_compared(client: TestClient) -> None:
    page = client.get("/compare", params={"label": "team=vision", "add": "all"}).text
    assert len(re.findall(r'name="id" value="[^"]+" checked', page)) == 20 and 'id="add-all"' not in page
