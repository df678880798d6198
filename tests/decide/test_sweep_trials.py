"""decide.trials: proposals by strategy within max_parallel and max_trials, the early-stop rules on hand-made
curves (with their reasons), the best trial and when a sweep is done. Pure: no store, no clock."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence

import pytest

from jobplane.decide.trials import (
    BAYES_STARTUP,
    EarlyStop,
    Proposal,
    TrialView,
    best,
    grid_point,
    plan,
    random_point,
    rungs,
    trial_id,
)
from jobplane.model.spec import parse_spec
from jobplane.model.specfields import HpValue
from jobplane.model.states import State
from jobplane.model.sweepspec import SweepSpec

HEAD = "run: python3 train.py\ninstance_type: g5.xlarge\nmetrics: [{name: 'val:loss', regex: 'loss (\\S+)'}]\n"


def sweep_of(body: str, goal: str = "minimize") -> SweepSpec:
    lines = [*body.strip("\n").splitlines(), f"objective: {{metric: 'val:loss', goal: {goal}}}"]
    sweep = parse_spec(HEAD + "sweep:\n" + "".join(f"  {line}\n" for line in lines), job_id="s").sweep
    assert sweep is not None
    return sweep


RANDOM = sweep_of("""
parameters:
  lr: {loguniform: [1.0e-4, 1.0e-1]}
  momentum: {uniform: [0.5, 0.99]}
  warmup: {int: [0, 1000]}
  batch_size: {choice: [32, 64, 128]}
  width: {uniform: [1, 2], steps: 5}
max_trials: 50
max_parallel: 4
seed: 7
""")


def view(number: int, state: State | None = State.RUNNING, curve: Sequence[tuple[int, float]] = (),
         final: float | None = None) -> TrialView:
    return TrialView(number=number, job_id=trial_id("s", number), params={}, state=state, curve=tuple(curve),
                     final=final)


def num(value: HpValue) -> float:
    assert isinstance(value, int | float)
    return float(value)


def test_trial_ids_are_job_ids() -> None:
    assert trial_id("search", 3) == "search-t003" and trial_id("search", 1000) == "search-t1000"
    with pytest.raises(ValueError, match="not a valid job id"):
        trial_id("s" * 60, 3)


def test_random_draws_stay_in_bounds_and_depend_on_seed_and_number_only() -> None:
    points = [random_point(RANDOM, n) for n in range(1, 501)]
    for point in points:
        assert list(point) == ["batch_size", "lr", "momentum", "warmup", "width"]
        assert 1e-4 <= num(point["lr"]) <= 0.1 and 0.5 <= num(point["momentum"]) <= 0.99
        assert point["warmup"] in range(1001) and point["batch_size"] in (32, 64, 128)
        assert point["width"] in (1, 1.25, 1.5, 1.75, 2)
    assert points == [random_point(RANDOM, n) for n in range(1, 501)]  # a rerun proposes the same
    assert len({p["lr"] for p in points}) == 500
    # every value of a finite set comes up; log-uniform puts about as many draws in each decade
    assert {p["batch_size"] for p in points} == {32, 64, 128} and len({p["width"] for p in points}) == 5
    decades = [sum(10 ** -(k + 1) <= num(p["lr"]) < 10 ** -k for p in points) for k in (1, 2, 3)]
    assert all(120 < d < 215 for d in decades), decades
    # the parameters' order in the document (or in a stored record, sorted) changes nothing
    reordered = RANDOM.model_copy(update={"parameters": dict(reversed(list(RANDOM.parameters.items())))})
    assert random_point(reordered, 9) == random_point(RANDOM, 9)
    assert random_point(RANDOM.model_copy(update={"seed": 8}), 9) != random_point(RANDOM, 9)


def test_a_grid_enumerates_every_combination_once_in_a_fixed_order() -> None:
    grid = sweep_of("""
strategy: grid
parameters:
  opt: {choice: [adam, sgd]}
  depth: {int: [2, 4]}
  lr: {loguniform: [1.0e-3, 1.0e-1], steps: 3}
""")
    points = [grid_point(grid, n) for n in range(1, 19)]
    expected: list[dict[str, HpValue]] = [{"depth": d, "lr": lr, "opt": o}
                for d, lr, o in itertools.product([2, 3, 4], [0.001, 0.01, 0.1], ["adam", "sgd"])]
    assert points == expected
    with pytest.raises(ValueError, match="past the grid's 18 combinations"):
        grid_point(grid, 19)
    proposals = plan(grid.model_copy(update={"max_parallel": 3}), []).propose
    assert proposals == tuple(Proposal(n, expected[n - 1]) for n in (1, 2, 3))


def test_proposals_keep_within_max_parallel_and_max_trials() -> None:
    sweep = RANDOM.model_copy(update={"max_trials": 6, "max_parallel": 3})
    first = plan(sweep, [])
    assert [p.number for p in first.propose] == [1, 2, 3] and not first.done
    assert [p.params for p in first.propose] == [random_point(sweep, n) for n in (1, 2, 3)]
    # a proposed trial with no record yet counts as live, as does a preempted one
    trials = [view(1, None), view(2, State.PREEMPTED), view(3, State.SUCCEEDED, final=0.5)]
    assert [p.number for p in plan(sweep, trials).propose] == [4]
    trials = [view(1, State.FAILED), view(2, State.CANCELLED), view(3, State.SUCCEEDED, final=0.5),
              view(4, State.RUNNING), view(5, State.INVALID)]
    assert [p.number for p in plan(sweep, trials).propose] == [6]  # failed trials count towards max_trials
    trials += [view(6, State.QUEUED)]
    assert plan(sweep, trials).propose == () and not plan(sweep, trials).done
    ended = [*trials[:3], view(4, State.STALLED), trials[4], view(6, State.TIMED_OUT)]
    assert plan(sweep, ended).propose == () and plan(sweep, ended).done
    over = [view(n, State.RUNNING) for n in range(1, 5)]  # more live than max_parallel (it was lowered): none
    assert plan(sweep, over).propose == ()


def test_best_is_by_goal_and_the_lower_number_on_ties() -> None:
    trials = [view(1, State.SUCCEEDED, final=0.4), view(2, State.SUCCEEDED, final=0.2),
              view(3, State.SUCCEEDED, final=0.2), view(4, State.FAILED), view(5, State.SUCCEEDED, final=math.nan),
              view(6, State.SUCCEEDED, final=0.9)]
    minimize = sweep_of("parameters: {n: {int: [1, 9]}}\nmax_trials: 6")
    assert (b := best(minimize, trials)) is not None and b.number == 2
    maximize = sweep_of("parameters: {n: {int: [1, 9]}}\nmax_trials: 6", goal="maximize")
    assert (b := best(maximize, trials)) is not None and b.number == 6
    assert plan(maximize, trials).best == trials[5]
    assert best(minimize, [view(1, State.RUNNING), view(2, State.SUCCEEDED, final=math.nan)]) is None


MEDIAN = sweep_of("parameters: {n: {int: [1, 9]}}\nmax_trials: 9\nmax_parallel: 9\n"
                  "early_stop: {rule: median, after_step: 200}")


def curve(*values: float, every: int = 100) -> list[tuple[int, float]]:
    return [(every * (i + 1), v) for i, v in enumerate(values)]


def test_the_median_rule_stops_a_trial_worse_than_the_others_running_averages() -> None:
    peers = [view(1, State.SUCCEEDED, curve(0.9, 0.5, 0.3, 0.2), final=0.2),  # averages to 200: 0.7, 0.5667...
             view(2, State.CANCELLED, curve(0.8, 0.6, 0.4)),  # 0.7, 0.6
             view(3, State.RUNNING, curve(1.0, 0.2)),  # 0.6 at 200; it never reached 300
             ]
    bad = view(4, State.RUNNING, curve(1.2, 1.0, 0.95))  # best 0.95 by 300: only 1 and 2 reached 300
    assert plan(MEDIAN, [*peers, bad]).stop == ()
    late = view(5, State.RUNNING, curve(0.5, 0.45, 0.44, 0.43, 0.42, every=50))  # s=250: 1, 2, 4 reached it
    stop = plan(MEDIAN, [*peers, bad, late]).stop
    assert stop == ()  # 0.42 vs the median of (0.7, 0.7, 1.1) = 0.7: better
    slow = view(6, State.RUNNING, curve(1.1, 0.98))  # at 200: 1, 2, 3, 4 (and 5's last step 250) reached it
    [stop_6] = plan(MEDIAN, [*peers, bad, late, slow]).stop
    # running averages up to 200: 0.7, 0.7, 0.6, 1.1 and trial 5's (0.5+0.45+0.44+0.43)/4 = 0.455
    assert stop_6 == EarlyStop("s-t006", "early stop (median rule): val:loss best 0.98 by step 200 is worse than "
                                         "the median 0.7 of 5 other trials' running averages up to step 200")


def test_the_median_rule_waits_for_after_step_and_enough_peers_and_stops_only_live_trials() -> None:
    peers = [view(n, State.SUCCEEDED, curve(0.1, 0.1, 0.1), final=0.1) for n in (1, 2, 3)]
    early = view(4, State.RUNNING, curve(5.0))  # step 100 < after_step 200
    assert plan(MEDIAN, [*peers, early]).stop == ()
    assert [s.job_id for s in plan(MEDIAN, [*peers, view(4, State.RUNNING, curve(5.0, 5.0))]).stop] == ["s-t004"]
    assert plan(MEDIAN, [*peers[:2], view(4, State.RUNNING, curve(5.0, 5.0))]).stop == ()  # 2 peers: too few
    ended = [view(4, state, curve(5.0, 5.0)) for state in (State.FAILED, State.CANCELLED)]
    assert plan(MEDIAN, [*peers, *ended]).stop == ()
    assert plan(MEDIAN, [*peers, view(4, None)]).stop == ()  # proposed, no record: nothing to stop
    sparse = view(5, State.SUCCEEDED, [(500, 0.1)], final=0.1)  # nothing up to step 200: no running average there
    assert plan(MEDIAN, [*peers[:2], sparse, view(4, State.RUNNING, curve(5.0, 5.0))]).stop == ()
    nan = view(4, State.RUNNING, curve(math.nan, math.nan))  # a diverged trial is the worst of all
    [stop] = plan(MEDIAN, [*peers, nan]).stop
    assert stop.reason.startswith("early stop (median rule): val:loss best nan by step 200 is worse than the "
                                  "median 0.1 of 3")


def test_the_median_rule_follows_the_goal() -> None:
    maximize = MEDIAN.model_copy(update={"objective": MEDIAN.objective.model_copy(update={"goal": "maximize"})})
    peers = [view(n, State.SUCCEEDED, curve(0.6, 0.8), final=0.8) for n in (1, 2, 3)]
    assert plan(maximize, [*peers, view(4, State.RUNNING, curve(0.9, 0.95))]).stop == ()
    [stop] = plan(maximize, [*peers, view(4, State.RUNNING, curve(0.5, 0.65))]).stop
    assert stop.reason == ("early stop (median rule): val:loss best 0.65 by step 200 is worse than the median 0.7 "
                           "of 3 other trials' running averages up to step 200")


ASHA = sweep_of("parameters: {n: {int: [1, 9]}}\nmax_trials: 9\nmax_parallel: 9\n"
                "early_stop: {rule: asha, after_step: 100}")


def test_asha_rungs() -> None:
    assert rungs(100, 99) == [100] and rungs(100, 299) == [100] and rungs(100, 900) == [900, 300, 100]


def test_asha_keeps_the_top_third_at_the_highest_rung_with_enough_trials() -> None:
    done = [view(1, State.SUCCEEDED, curve(0.5, 0.4, 0.3), final=0.3),
            view(2, State.SUCCEEDED, curve(0.6, 0.5, 0.45), final=0.45),
            view(3, State.CANCELLED, curve(0.9))]
    # at rung 100 (3 trials): keep 1; trial 4 at 0.55 is beaten by trial 1's 0.5 -> stop
    [stop] = plan(ASHA, [*done, view(4, State.RUNNING, curve(0.55, 0.5))]).stop
    assert stop == EarlyStop("s-t004", "early stop (asha): val:loss 0.55 at rung step 100 is not in the top 1/3 "
                                       "(1 of the 4 trials that reached it): 1 did better, the top 1 reached 0.5")
    assert plan(ASHA, [*done, view(4, State.RUNNING, curve(0.45, 0.5))]).stop == ()  # the best at rung 100
    # at 300 only trials 1, 2 and this one: judged there (keep 1), not at 100
    [stop] = plan(ASHA, [*done, view(4, State.RUNNING, curve(0.8, 0.5, 0.35))]).stop
    assert stop.reason == ("early stop (asha): val:loss 0.35 at rung step 300 is not in the top 1/3 (1 of the 3 "
                           "trials that reached it): 1 did better, the top 1 reached 0.3")
    assert plan(ASHA, [*done, view(4, State.RUNNING, curve(0.8, 0.5, 0.25))]).stop == ()
    # a trial's value at a rung is its first point at or past it
    assert plan(ASHA, [*done[:2], view(4, State.RUNNING, [(250, 0.2)])]).stop == ()  # 0.2 counts at rung 100
    [stop] = plan(ASHA, [*done, view(4, State.RUNNING, [(150, 0.7)])]).stop
    assert "0.7 at rung step 100" in stop.reason


def test_no_rule_stops_nothing() -> None:
    sweep = MEDIAN.model_copy(update={"early_stop": None})
    trials = [*(view(n, State.SUCCEEDED, curve(0.1, 0.1), final=0.1) for n in (1, 2, 3)),
              view(4, State.RUNNING, curve(5.0, 5.0))]
    assert plan(sweep, trials).stop == ()


BAYES = """
parameters:
  lr: {loguniform: [1.0e-5, 1.0]}
  width: {int: [1, 64]}
  opt: {choice: [adam, sgd, [1, 2]]}
  depth: {uniform: [1, 5], steps: 5}
max_trials: 40
max_parallel: 4
seed: 3
"""


def known_loss(params: Mapping[str, HpValue]) -> float:
    """Best at lr 10^-2.5, width 40, adam; depth does not matter."""
    return (math.log10(num(params["lr"])) + 2.5) ** 2 + ((num(params["width"]) - 40) / 16) ** 2 + \
        (0.0 if params["opt"] == "adam" else 0.5)


def run_sweep(sweep: SweepSpec) -> list[TrialView]:
    """The sweep to its end, one trial finishing (the oldest live) between two plans, each with the known loss."""
    trials: list[TrialView] = []
    while not (now := plan(sweep, trials)).done:
        trials += [TrialView(p.number, trial_id("s", p.number), p.params, State.RUNNING, (), None) for p in now.propose]
        oldest = next(t for t in trials if t.state is State.RUNNING)
        loss = known_loss(oldest.params)
        trials[oldest.number - 1] = TrialView(oldest.number, oldest.job_id, oldest.params, State.SUCCEEDED,
                                              ((100, loss),), loss)
    return trials


def test_bayesian_concentrates_near_the_optimum_better_than_random() -> None:
    distance, loss = {"bayesian": 0.0, "random": 0.0}, {"bayesian": 0.0, "random": 0.0}
    for seed in (0, 1, 2):  # three searches each, so no one lucky draw decides
        body = BAYES.replace("seed: 3", f"seed: {seed}")
        bayesian, random = run_sweep(sweep_of(body + "strategy: bayesian")), run_sweep(sweep_of(body))
        assert len(bayesian) == len(random) == 40
        for trial in bayesian:
            p = trial.params
            assert 1e-5 <= num(p["lr"]) <= 1 and p["width"] in range(1, 65) and p["opt"] in ("adam", "sgd", [1, 2])
            assert p["depth"] in (1, 2, 3, 4, 5)
        # the first BAYES_STARTUP trials are the random strategy's own draws; after them TPE takes over
        assert [t.params for t in bayesian[:BAYES_STARTUP]] == [t.params for t in random[:BAYES_STARTUP]]
        for name, trials in (("bayesian", bayesian), ("random", random)):
            distance[name] += statistics.median(abs(math.log10(num(t.params["lr"])) + 2.5) for t in trials[20:])
            loss[name] += statistics.median(t.final or 0.0 for t in trials[20:])
    assert distance["bayesian"] < distance["random"] / 2, distance  # 1.4 against 4.0 (decades from the best lr)
    assert loss["bayesian"] < loss["random"] / 2, loss  # 3.0 against 11.0


def test_bayesian_proposals_are_a_function_of_the_trials_and_keep_away_from_live_ones() -> None:
    sweep = sweep_of(BAYES + "strategy: bayesian")
    trials = run_sweep(sweep)[:20]
    again = plan(sweep, trials)
    assert [p.number for p in again.propose] == [21, 22, 23, 24]
    assert plan(sweep, trials) == again  # rebuilt from the views each call: the same views, the same proposals
    assert len({repr(sorted(p.params.items())) for p in again.propose}) == 4
    # trials stopped early (a curve, no final), failed ones and a value the space does not hold all read
    ended = [TrialView(21, "s-t021", again.propose[0].params, State.CANCELLED, ((100, 9.0), (200, 8.0)), None),
             TrialView(22, "s-t022", again.propose[1].params, State.FAILED, (), None),
             TrialView(23, "s-t023", {**again.propose[2].params, "opt": "rmsprop"}, State.SUCCEEDED, ((1, 0.1),), 0.1)]
    later = plan(sweep, [*trials, *ended]).propose
    assert [p.number for p in later] == [24, 25, 26, 27]
    assert all(1e-5 <= num(p.params["lr"]) <= 1 for p in later)
