"""The dashboard's sweep pages over a sweep run by the real launcher and sweeper in memory
(tests/control/reconcile/day.py): the sweeps table, a sweep's trials best first, one scatter per parameter with its
dots where their values put them (a log axis for a loguniform parameter, a choice's values in order), and the scales
under them."""

from __future__ import annotations

import math
import re

import pytest

from jobplane import sdk
from jobplane.ui import sweeps
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import finish, launch_drops, prints, start, sweep_spec
from tests.ui.apps import TestClient, over, served

pytestmark = pytest.mark.timeout(60)
EVIL = "<script>alert(1)</script>"
PARAMETERS = ("    lr: {loguniform: [0.0001, 0.1]}\n"
              f"    opt: {{choice: [sgd, adam, '{EVIL}']}}\n"
              "    warmup: {int: [0, 100]}\n")


def client_of(day: Day) -> sdk.Client:
    return over(day.reg, lambda: day.compute)


@pytest.fixture
def web(day: Day) -> TestClient:
    return served(client_of(day))


def four_trials(day: Day) -> dict[str, float]:
    """Sweep s: trials 1 to 3 finish with a final loss, trial 4 runs and has printed one; the losses by job."""
    spec = "env:\n  API_KEY: hunter2-secret\n" + sweep_spec(max_trials=4, max_parallel=4, parameters=PARAMETERS)
    assert day.submit("s", spec) == "sweep"
    trials = launch_drops(day)
    assert trials == ["s-t001", "s-t002", "s-t003", "s-t004"]
    start(day, *trials)
    losses = {"s-t001": 0.5, "s-t002": 0.05, "s-t003": 2.5}
    for job_id, loss in losses.items():
        finish(day, job_id, final=loss)
    prints(day, "s-t004", {10: 1.5, 20: 0.9})
    day.sweeper()
    return losses | {"s-t004": 0.9}


def test_the_sweeps_page_lists_sweeps_at_work_and_ended_ones_when_asked(day: Day, web: TestClient) -> None:
    four_trials(day)
    page = web.get("/sweeps").text
    row = re.search(r'<tr data-sweep="s">(.*?)</tr>', page, re.S)
    assert row and "RUNNING" in row[1] and "4 of 4" in row[1] and "loss (minimize)" in row[1] and "random" in row[1]
    assert "0.05" in row[1] and 'href="/jobs/s-t002"' in row[1]  # the best so far
    finish(day, "s-t004", final=0.9)
    day.sweeper()
    assert 'data-sweep="s"' not in web.get("/sweeps").text
    ended = web.get("/sweeps", params={"all": "1"}).text
    assert 'data-sweep="s"' in ended and "COMPLETED" in ended and "4 trials: 4 SUCCEEDED; best s-t002" in ended


def test_a_sweep_page_shows_its_trials_best_first_and_a_scatter_per_parameter(day: Day, web: TestClient) -> None:
    losses = four_trials(day)
    response = web.get("/sweeps/s")
    assert response.status_code == 200
    page = response.text
    assert 'hx-get="/sweeps/s/body"' in page  # live: the body follows it
    assert re.search(r'id="best">Best: <a href="/jobs/s-t002">trial 2', page)
    assert "API_KEY" in page and "hunter2" not in page  # the template's env values are hidden, as a job's
    # finished trials by their loss, then the live one
    assert re.findall(r'<tr data-trial="(\d+)"', page) == ["2", "1", "3", "4"]
    assert re.search(r'<tr data-trial="4">.*?0\.9 <small class="muted">latest</small>.*?RUNNING', page, re.S)
    figures = dict(re.findall(r'<figure class="scatter" data-parameter="(\w+)" data-dots="(\d+)"', page))
    assert figures == {"lr": "4", "opt": "4", "warmup": "4"}
    assert 'data-parameter="lr" data-dots="4" data-log-x="1"' in page
    assert page.count('class="dot final') == 3 * 3 and page.count('class="dot live') == 3
    assert page.count('class="dot final best"') == 3  # s-t002, on each chart

    record = client_of(day).sweep("s").record
    lr = next(c for c in sweeps.scatters(record, client_of(day).sweep("s").trials()) if c.parameter == "lr")
    assert [t.text for t in lr.x_ticks] == ["0.0001", "0.001", "0.01", "0.1"]  # decades: a log axis
    for dot in lr.dots:
        value = float(record.trials[dot.number - 1].params["lr"])
        expected = sweeps.LEFT + (math.log10(value) + 4) / 3 * (sweeps.WIDTH - sweeps.LEFT - sweeps.RIGHT)
        assert dot.x == pytest.approx(expected, abs=0.1)
    ys = {dot.job_id: dot.y for dot in lr.dots}
    assert sorted(ys, key=ys.__getitem__) == sorted(losses, key=losses.__getitem__, reverse=True)  # up is higher
    assert lr.log_y is False  # 0.05 to 2.5: less than two decades


def test_a_choice_is_an_axis_of_its_values_in_order_and_shown_as_text(day: Day, web: TestClient) -> None:
    four_trials(day)
    page = web.get("/sweeps/s").text
    assert EVIL not in page and "&lt;script&gt;" in page
    trials = client_of(day).sweep("s").trials()
    opt = next(c for c in sweeps.scatters(client_of(day).sweep("s").record, trials) if c.parameter == "opt")
    assert [t.text for t in opt.x_ticks] == ["sgd", "adam", EVIL[:sweeps.CHOICE_LABEL]]
    places = {t.text: t.at for t in opt.x_ticks}
    for dot, trial in ((d, next(t for t in trials if t.number == d.number)) for d in opt.dots):
        assert dot.x == places[str(trial.params["opt"])[:sweeps.CHOICE_LABEL]]


def test_an_unknown_sweep_is_a_404_and_the_body_is_a_fragment(day: Day, web: TestClient) -> None:
    assert web.get("/sweeps/nope").status_code == 404 and "No sweep nope" in web.get("/sweeps/nope").text
    assert web.get("/sweeps/Not_An_Id").status_code == 404
    four_trials(day)
    body = web.get("/sweeps/s/body").text
    assert body.lstrip().startswith('<div id="sweep-body"') and "<html" not in body


def test_a_trial_page_links_to_its_sweep(day: Day, web: TestClient) -> None:
    four_trials(day)
    assert 'href="/sweeps/s"' in web.get("/jobs/s-t001").text


def test_objectives_over_decades_get_a_log_axis() -> None:
    y = sweeps.padded([0.001, 0.01, 5.0], log=True)
    assert y.log and y.lo < 0.001 and y.hi > 5.0
    assert y.ticks() == [0.001, 0.01, 0.1, 1.0]
    assert y.at(0.001) < y.at(0.01) < y.at(5.0) and y.at(0.01) - y.at(0.001) == pytest.approx(
        y.at(0.1) - y.at(0.01))
    linear = sweeps.Scale(0.0, 1.0)
    assert linear.ticks() == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert sweeps.Scale(0.0, 100.0).ticks() == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    assert sweeps.padded([3.0], log=False).at(3.0) == pytest.approx(0.5)
