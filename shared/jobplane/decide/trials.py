"""A sweep's decision: which trials to propose next, which live ones to stop early, whether it is done and which
trial is best. Pure: the trials' views in (their parameters, states and objective curves), a Plan out.

Everything is derived from the views each time: a random trial's parameters are a function of (seed, number), a
grid trial's of its number, a bayesian one's of (seed, number) and the trials so far (optuna's TPE, rebuilt on
every call), so a run that repeats the decision (after losing a CAS, or a crash) proposes the same trials again.
The sweep's record keeps what was proposed; the CAS on it keeps two runs from both adding.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from jobplane.model.keys import JobData
from jobplane.model.spec import job_id_problem
from jobplane.model.specfields import HpValue
from jobplane.model.states import TERMINAL, State
from jobplane.model.sweepspec import ArraySpec, Distribution, SweepSpec, member_suffix, trial_suffix

MEDIAN_MIN_PEERS = 3  # the median rule judges a trial only against at least this many other trials at its step
BAYES_STARTUP = 10  # bayesian proposes as random until this many trials have finished (optuna's n_startup_trials)
ASHA_ETA = 3  # asha's reduction factor: rungs at after_step * 3^k, the top third of each rung goes on


@dataclass(frozen=True)
class TrialView:
    number: int  # 1-based: trial 3 of sweep S is job f"{S}-t003" (trial_id(S, 3))
    job_id: str
    params: Mapping[str, HpValue]  # as proposed
    state: State | None  # None: proposed, no job record yet (its drop is queued or being written)
    curve: tuple[tuple[int, float], ...]  # (step, value) of the objective metric on rank 0, all attempts, step order
    final: float | None  # the objective of a SUCCEEDED trial: its last point's value; else None
    data: JobData | None = None  # where its job's artifacts are (JobRecord.data), when its record was read

    @property
    def live(self) -> bool:
        return self.state is None or self.state not in TERMINAL


@dataclass(frozen=True)
class Proposal:
    number: int
    params: dict[str, HpValue]


@dataclass(frozen=True)
class EarlyStop:
    job_id: str
    reason: str  # names the rule and the values compared


@dataclass(frozen=True)
class Plan:
    propose: tuple[Proposal, ...]  # next trials, numbers continuing from len(trials)+1
    stop: tuple[EarlyStop, ...]  # live trials to stop early
    done: bool  # max_trials proposed and every trial terminal
    best: TrialView | None  # by `final` and the goal (ties: lower number); None if no trial has one


def trial_id(sweep_id: str, number: int, *, array: bool = False) -> str:
    """Trial `number`'s job id (an array's: member number - 1's, <array>-<index>); a sweep or array id the spec
    accepted always leaves room for it."""
    job_id = sweep_id + (member_suffix(number - 1) if array else trial_suffix(number))
    if problem := job_id_problem(job_id):
        raise ValueError(problem)
    return job_id


def parent_of(job_id: str) -> tuple[str, bool] | None:
    """The sweep (or array: True) whose trial (member) id job_id is by trial_id's naming alone, or None for an id
    of neither shape; whether that sweep or array exists, and lists it, is the registry's to say."""
    found = re.fullmatch(r"(.+)-(?:t([0-9]{3,})|(0|[1-9][0-9]*))", job_id)
    if found is None:
        return None
    parent, trial, index = found.groups()
    number, array = (int(trial), False) if trial else (int(index) + 1, True)
    suffix = member_suffix(number - 1) if array else trial_suffix(number)
    return (parent, array) if number >= 1 and parent + suffix == job_id else None  # t000, t0001: no trial's


def plan(sweep: SweepSpec | ArraySpec, trials: Sequence[TrialView]) -> Plan:
    """What a sweep does next, from its trials alone (every trial proposed so far, with or without a job record).
    An array is a sweep whose trials (its members) differ by their index alone: no parameters, no early stop, no
    best; it proposes the next members as earlier ones end, and is done when every one has ended."""
    trials = sorted(trials, key=lambda t: t.number)
    live = sum(t.live for t in trials)
    count = max(0, min(sweep.parallel - live, sweep.trial_count - len(trials)))
    numbers = range(len(trials) + 1, len(trials) + 1 + count)
    if isinstance(sweep, ArraySpec):
        done = not numbers and len(trials) >= sweep.trial_count and live == 0
        return Plan(propose=tuple(Proposal(n, {}) for n in numbers), stop=(), done=done, best=None)
    propose = tuple(Proposal(n, params) for n, params in zip(numbers, proposals(sweep, numbers, trials), strict=True))
    stop = tuple(_early_stops(sweep, trials))
    done = not propose and len(trials) >= sweep.trial_count and live == 0
    return Plan(propose=propose, stop=stop, done=done, best=best(sweep, trials))


def proposals(sweep: SweepSpec, numbers: Sequence[int], trials: Sequence[TrialView]) -> list[dict[str, HpValue]]:
    """The parameters of the trials numbered `numbers`, proposed together after `trials`, by the sweep's strategy."""
    if sweep.strategy == "grid":
        return [grid_point(sweep, n) for n in numbers]
    if sweep.strategy == "bayesian" and sum(_observed(t) for t in trials) >= BAYES_STARTUP:
        return bayesian_points(sweep, numbers, trials)
    return [random_point(sweep, n) for n in numbers]


def _names(sweep: SweepSpec) -> list[str]:
    # sorted, so a record that stored the parameters in another order (JSON with sort_keys) proposes the same
    return sorted(sweep.parameters)


def random_point(sweep: SweepSpec, number: int) -> dict[str, HpValue]:
    """Independent draws from a generator seeded by (seed, number) alone."""
    rng = random.Random(f"jobplane-sweep:{sweep.seed}:{number}")
    return {name: sweep.parameters[name].sample(rng) for name in _names(sweep)}


def grid_point(sweep: SweepSpec, number: int) -> dict[str, HpValue]:
    """The number-th combination (1-based) in a fixed order: parameters by name, the last one varying fastest."""
    names = _names(sweep)
    sizes = [sweep.parameters[name].size for name in names]
    if None in sizes:
        raise ValueError("a grid needs every parameter finite")
    index = number - 1
    point: dict[str, HpValue] = {}
    for name, size in reversed(list(zip(names, sizes, strict=True))):
        assert size is not None
        index, i = divmod(index, size)
        point[name] = sweep.parameters[name].point(i)
    if index:
        raise ValueError(f"trial {number} is past the grid's {sweep.grid_size} combinations")
    return {name: point[name] for name in names}


def _observed(trial: TrialView) -> bool:
    return trial.final is not None and math.isfinite(trial.final)


def bayesian_points(sweep: SweepSpec, numbers: Sequence[int], trials: Sequence[TrialView]) -> list[dict[str, HpValue]]:
    """optuna's TPE over a study rebuilt from the trials (nothing is kept between runs): finished trials by their
    final objective, trials stopped early by their curves (as optuna's pruned trials), live ones by their parameters
    alone. Each proposal is seeded by (seed, number) and stays in the study as a live trial, so the constant liar
    keeps the next one away from it as from the trials already running."""
    import optuna  # only a sweeper running a bayesian sweep pays for the import

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    spaces = {name: _Space(sweep.parameters[name]) for name in _names(sweep)}
    distributions = {name: space.optuna for name, space in spaces.items()}
    study = optuna.create_study(direction=sweep.objective.goal)
    for trial in trials:
        indexes = {name: space.index(trial.params.get(name)) for name, space in spaces.items()}
        if None in indexes.values():
            continue  # a value the space does not hold (a hand-edited record): it tells TPE nothing
        params = {name: i for name, i in indexes.items() if i is not None}
        curve = {step: value for step, value in trial.curve if math.isfinite(value)}
        if trial.live:
            frozen = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params=params,
                                               distributions=distributions)
        elif _observed(trial):
            frozen = optuna.trial.create_trial(value=trial.final, params=params, distributions=distributions)
        elif curve:
            frozen = optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params=params,
                                               distributions=distributions, intermediate_values=curve)
        else:
            continue  # failed with nothing to learn from
        study.add_trial(frozen)
    out = []
    for number in numbers:
        seed = random.Random(f"jobplane-tpe:{sweep.seed}:{number}").getrandbits(31)
        study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=BAYES_STARTUP, constant_liar=True)
        asked = study.ask(distributions)
        out.append({name: space.value(asked.params[name]) for name, space in spaces.items()})
    return out


class _Space:
    """One parameter as optuna samples it: ranges as they are, a choice by its index (a value may be any JSON) and a
    range with steps by the index of its step (in log space for loguniform, as the values are)."""

    def __init__(self, distribution: Distribution) -> None:
        import optuna

        self.distribution = d = distribution
        self.optuna: optuna.distributions.BaseDistribution
        if d.choice is not None:
            self.optuna = optuna.distributions.CategoricalDistribution(list(range(len(d.choice))))
        elif d.integer is not None:
            self.optuna = optuna.distributions.IntDistribution(*d.integer)
        elif d.steps is not None:
            self.optuna = optuna.distributions.IntDistribution(0, d.steps - 1)
        elif d.uniform is not None:
            self.optuna = optuna.distributions.FloatDistribution(*d.uniform)
        else:
            assert d.loguniform is not None
            self.optuna = optuna.distributions.FloatDistribution(*d.loguniform, log=True)

    def index(self, value: HpValue | None) -> int | float | None:
        """Where value sits in the space (optuna's internal value), or None when it is not one of its values."""
        d = self.distribution
        if d.choice is not None:
            return next((i for i, c in enumerate(d.choice) if c == value and type(c) is type(value)), None)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        if d.steps is not None:
            return next((i for i in range(d.steps) if d.point(i) == value), None)
        if d.integer is not None:
            return int(value) if value == int(value) and d.integer[0] <= value <= d.integer[1] else None
        lo, hi = d.uniform or d.loguniform or (0.0, 0.0)
        return float(value) if lo <= value <= hi else None

    def value(self, sampled: object) -> HpValue:
        d = self.distribution
        assert isinstance(sampled, int | float)
        if d.choice is not None:
            return d.choice[int(sampled)]
        if d.steps is not None:
            return d.point(int(sampled))
        return int(sampled) if d.integer is not None else float(sampled)


def badness(sweep: SweepSpec) -> Callable[[float], float]:
    """A value as a loss (lower is better) by the goal; NaN worst of all."""
    sign = 1.0 if sweep.objective.goal == "minimize" else -1.0
    return lambda value: math.inf if math.isnan(value) else sign * value


def best(sweep: SweepSpec, trials: Sequence[TrialView]) -> TrialView | None:
    """The trial with the best finite `final`; ties go to the lower number."""
    key = badness(sweep)
    scored = [t for t in trials if _observed(t)]
    return min(scored, key=lambda t: (key(t.final or 0.0), t.number), default=None)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class _Curve:
    """A trial's objective points as the rules read them (in step order): its badness summed up to each point, so a
    running average or a value at a step is a bisection away, whatever the number of trials and points."""

    def __init__(self, trial: TrialView, key: Callable[[float], float]) -> None:
        self.trial = trial
        self.steps = [step for step, _ in trial.curve]
        self.values = [value for _, value in trial.curve]
        self.sums = list(itertools.accumulate(key(value) for value in self.values))

    @property
    def last(self) -> int:
        return self.steps[-1]

    def spans(self, step: int) -> bool:
        """It has points up to step and at or past it."""
        return self.steps[0] <= step <= self.steps[-1]

    def running_average(self, step: int) -> float:
        """The mean badness of its points up to step (one that spans it)."""
        count = bisect.bisect_right(self.steps, step)
        return self.sums[count - 1] / count

    def at(self, step: int) -> float:
        """Its value when it reached this step: its first point at or past it."""
        return self.values[bisect.bisect_left(self.steps, step)]


def _early_stops(sweep: SweepSpec, trials: Sequence[TrialView]) -> list[EarlyStop]:
    rule = sweep.early_stop
    if rule is None:
        return []
    if not any(t.state is not None and t.live and t.curve and t.curve[-1][0] >= rule.after_step for t in trials):
        return []  # nothing to judge: no need to read every curve
    key = badness(sweep)
    curves = [_Curve(t, key) for t in trials if t.curve]
    judged = [c for c in curves if c.trial.state is not None and c.trial.live and c.last >= rule.after_step]
    decide = _median if rule.rule == "median" else _asha
    return [stop for c in judged if (stop := decide(sweep, c, curves)) is not None]


def _median(sweep: SweepSpec, mine: _Curve, curves: Sequence[_Curve]) -> EarlyStop | None:
    """Stop the trial if its best value so far, at its latest step s, is worse than the median of the other trials'
    running averages of the objective up to s (those with points up to s and at or past it; at least
    MEDIAN_MIN_PEERS of them)."""
    key = badness(sweep)
    step = mine.last
    best_so_far = min(mine.values, key=key)
    averages = [c.running_average(step) for c in curves if c is not mine and c.spans(step)]
    if len(averages) < MEDIAN_MIN_PEERS:
        return None
    median = statistics.median(averages)
    if not key(best_so_far) > median:
        return None
    shown = median if sweep.objective.goal == "minimize" else -median
    return EarlyStop(mine.trial.job_id, f"early stop (median rule): {sweep.objective.metric} best "
                                        f"{_fmt(best_so_far)} by step {step} is worse than the median {_fmt(shown)} "
                                        f"of {len(averages)} other trials' running averages up to step {step}")


def rungs(after_step: int, step: int) -> list[int]:
    """ASHA's rungs up to step, highest first: after_step * ASHA_ETA**k."""
    out = [after_step]
    while out[-1] * ASHA_ETA <= step and after_step > 0:
        out.append(out[-1] * ASHA_ETA)
    return out[::-1]


def _asha(sweep: SweepSpec, mine: _Curve, curves: Sequence[_Curve]) -> EarlyStop | None:
    """Asynchronous successive halving: at the highest rung the trial reached that at least ASHA_ETA trials reached,
    stop it unless it is in the top 1/ASHA_ETA of them by their values when they reached it."""
    assert sweep.early_stop is not None
    key = badness(sweep)
    for rung in rungs(sweep.early_stop.after_step, mine.last):
        there = [c for c in curves if c.last >= rung]
        if len(there) < ASHA_ETA:
            continue
        keep = len(there) // ASHA_ETA
        value = mine.at(rung)
        values = sorted((c.at(rung) for c in there), key=key)
        better = sum(key(v) < key(value) for v in values)
        if better < keep:
            return None
        return EarlyStop(mine.trial.job_id, f"early stop (asha): {sweep.objective.metric} {_fmt(value)} at rung step "
                                            f"{rung} is not in the top 1/{ASHA_ETA} ({keep} of the {len(there)} "
                                            f"trials that reached it): {better} did better, the top {keep} reached "
                                            f"{_fmt(values[keep - 1])}")
    return None
