"""A job spec's `sweep:` section: a hyperparameter search whose trials are jobs (docs/sweeps.md). The rest of the
spec is every trial's template; decide/trials.py proposes the trials and stops the losing ones early."""

from __future__ import annotations

import math
import random
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from jobplane.model.specfields import HpName, HpValue, MetricName, SpecModel

KINDS = ("uniform", "loguniform", "int", "choice")
MAX_TRIALS = 1000
MAX_PARALLEL = 100
MAX_STEPS = 1000
MAX_PARAMETERS = 100  # a trial's hyperparameters (the spec's and the sweep's) stay within the spec's own limit
TRIAL_LABELS = ("sweep", "trial")  # the labels every trial gets: its sweep's id and its number
MAX_ARRAY = MAX_TRIALS  # an array's members (AWS Batch allows 2 to 10,000; ours are bounded as a sweep's trials)
ARRAY_LABEL = "array"  # the label every member of an array gets: the array's id
MAX_JOB_ID = 63
MAX_LABELS = 32
DISTRIBUTION_HELP = ("{uniform: [lo, hi]}, {loguniform: [lo, hi]} (lo > 0), {int: [lo, hi]} or {choice: [a, b, ...]}; "
                     "uniform and loguniform also take steps: N")



def _pair(kind: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "array", "items": {"type": kind}, "minItems": 2, "maxItems": 2})


FloatRange = Annotated[tuple[float, float], _pair("number")]
IntRange = Annotated[tuple[int, int], _pair("integer")]


class Distribution(SpecModel):
    """Where one hyperparameter's values come from: exactly one of uniform, loguniform, int and choice. `steps`
    makes uniform or loguniform finite: N values evenly spaced from lo to hi (log-spaced for loguniform)."""

    model_config = ConfigDict(serialize_by_alias=True)

    uniform: FloatRange | None = Field(None, description="[lo, hi]: any float in between")
    loguniform: FloatRange | None = Field(None, description="[lo, hi], lo > 0: uniform in log space")
    integer: IntRange | None = Field(None, alias="int", description="[lo, hi]: any integer, both included")
    choice: list[HpValue] | None = Field(None, min_length=1, max_length=MAX_TRIALS,
                                         description="one of these values (numbers, strings, lists...)")
    steps: int | None = Field(None, ge=2, le=MAX_STEPS,
                              description="uniform or loguniform only: N values from lo to hi (what a grid needs)")

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"give a distribution: {DISTRIBUTION_HELP} (a fixed value goes in hyperparameters:)")
        unknown = [k for k in value if k not in (*KINDS, "steps")]
        if unknown:
            raise ValueError(f"unknown distribution {unknown[0]!r}: use {DISTRIBUTION_HELP}")
        kinds = [k for k in value if k in KINDS]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)}" + (f", not {' and '.join(kinds)}" if kinds
                                                                          else ""))
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Distribution:
        for kind, pair in (("uniform", self.uniform), ("loguniform", self.loguniform)):
            if pair is not None and not (math.isfinite(pair[0]) and math.isfinite(pair[1]) and pair[0] < pair[1]):
                raise ValueError(f"{kind}: [lo, hi] needs finite numbers with lo < hi, got {list(pair)}")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform: lo must be above 0, got {self.loguniform[0]}")
        if self.integer is not None and self.integer[0] > self.integer[1]:
            raise ValueError(f"int: [lo, hi] needs lo <= hi, got {list(self.integer)}")
        if self.steps is not None and self.uniform is None and self.loguniform is None:
            raise ValueError("steps: only for uniform and loguniform (int and choice are finite already)")
        return self

    @property
    def kind(self) -> str:
        return next(k for k, v in (("uniform", self.uniform), ("loguniform", self.loguniform),
                                   ("int", self.integer), ("choice", self.choice)) if v is not None)

    @property
    def size(self) -> int | None:
        """How many values it has; None: a continuous range."""
        if self.choice is not None:
            return len(self.choice)
        if self.integer is not None:
            return self.integer[1] - self.integer[0] + 1
        return self.steps

    def point(self, index: int) -> HpValue:
        """The index-th of its values (0 <= index < size), in order."""
        if self.choice is not None:
            return self.choice[index]
        if self.integer is not None:
            return self.integer[0] + index
        assert self.steps is not None, "a continuous range has no n-th value"
        if self.uniform is not None:
            lo, hi = self.uniform
            return _tidy(lo + (hi - lo) * index / (self.steps - 1))
        assert self.loguniform is not None
        lo, hi = math.log(self.loguniform[0]), math.log(self.loguniform[1])
        return _tidy(math.exp(lo + (hi - lo) * index / (self.steps - 1)))

    def sample(self, rng: random.Random) -> HpValue:
        """A value drawn with rng: each of a finite set equally likely, or uniform (in log space for loguniform)."""
        if (size := self.size) is not None:
            return self.point(rng.randrange(size))
        if self.uniform is not None:
            return rng.uniform(*self.uniform)
        assert self.loguniform is not None
        return math.exp(rng.uniform(math.log(self.loguniform[0]), math.log(self.loguniform[1])))


def _tidy(value: float) -> float:
    # 0.1 + 0.2 * 1 prints 0.30000000000000004: a grid's values are shown and compared, so 12 digits it is
    return float(f"{value:.12g}")


class Objective(SpecModel):
    """What the search optimizes: a metric the spec reads from the trials' output (rank 0)."""

    metric: MetricName = Field(description="a name in the spec's metrics (or the defaults' when it has none)")
    goal: Literal["minimize", "maximize"] = Field(description="minimize (a loss) or maximize (an accuracy)")


class EarlyStopRule(SpecModel):
    """Stop a losing live trial once it has reported the objective at after_step or later."""

    rule: Literal["median", "asha"] = Field(
        description="median: best so far worse than the median of the other trials' running averages at its step; "
                    "asha: successive halving, rungs at after_step * 3^k, keep the top third at each")
    after_step: int = Field(0, ge=0, description="no trial is judged before this step (asha: its first rung)")


class SweepSpec(SpecModel):
    """A hyperparameter search: trials of the rest of the spec, each with its parameters from these."""

    parameters: dict[HpName, Distribution] = Field(
        min_length=1, max_length=MAX_PARAMETERS,
        description=f"the hyperparameters searched, each from one distribution: {DISTRIBUTION_HELP}")
    strategy: Literal["grid", "random", "bayesian"] = Field(
        "random", description="grid: every combination, in order; random: independent draws; bayesian: optuna's "
                              "TPE over the finished trials")
    max_trials: int | None = Field(None, ge=1, le=MAX_TRIALS,
                                   description="trials in all; grid: at most (and by default) the grid's size")
    max_parallel: int = Field(1, ge=1, le=MAX_PARALLEL, description="trials live at once, at most")
    objective: Objective = Field(description="the metric the search optimizes and which way")
    early_stop: EarlyStopRule | None = Field(None, description="stop losing trials early; none by default")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="the same seed proposes the same trials")

    @property
    def grid_size(self) -> int | None:
        """The number of combinations of the parameters' values; None when one of them is continuous."""
        sizes = [d.size for d in self.parameters.values()]
        return None if None in sizes else math.prod(s for s in sizes if s is not None)

    @property
    def trial_count(self) -> int:
        """Trials in all: max_trials, or a grid's size."""
        if self.max_trials is not None:
            return self.max_trials
        return min(self.grid_size or 0, MAX_TRIALS) if self.strategy == "grid" else 0

    @property
    def parallel(self) -> int:
        """Trials live at once, at most."""
        return self.max_parallel


class ArraySpec(SpecModel):
    """An array job (AWS Batch's, Slurm's --array): `size` jobs of the rest of the spec, <id>-0 to <id>-(size-1),
    which differ by their index alone. A sweep without parameters: the same records and reconcile run them."""

    size: int = Field(ge=1, le=MAX_ARRAY, description="members in all: jobs <id>-0 to <id>-(size-1)")
    max_parallel: int | None = Field(
        None, ge=1, le=MAX_PARALLEL,
        description=f"members live at once, at most (never over size); unset: size, at most {MAX_PARALLEL} (the "
                    "owner's quota holds either way)")
    index: int | None = Field(
        None, ge=0, le=MAX_ARRAY - 1,
        description="set by jobplane on each member's spec: its index (JOBPLANE_ARRAY_INDEX); not in a submitted "
                    "spec")

    @property
    def trial_count(self) -> int:
        return self.size

    @property
    def parallel(self) -> int:
        """Members live at once, at most."""
        return self.max_parallel if self.max_parallel is not None else min(self.size, MAX_PARALLEL)


ALLOWED = {
    "array": list(ArraySpec.model_fields),
    "sweep": list(SweepSpec.model_fields),
    "sweep.objective": list(Objective.model_fields),
    "sweep.early_stop": list(EarlyStopRule.model_fields),
}


def known_fields(raw: object) -> object:
    """A stored sweep section without the fields this version does not know (spec.known_fields)."""
    if not isinstance(raw, dict):
        return raw
    out = {k: v for k, v in raw.items() if k in ALLOWED["sweep"]}
    for name in ("objective", "early_stop"):
        if isinstance(out.get(name), dict):
            out[name] = {k: v for k, v in out[name].items() if k in ALLOWED[f"sweep.{name}"]}
    return out


def trial_suffix(number: int) -> str:
    """What trial `number`'s job id adds to its sweep's id (decide.trials.trial_id)."""
    return f"-t{number:03d}"


def member_suffix(index: int) -> str:
    """What member `index`'s job id adds to its array's id, as AWS Batch names an array's children (<id>:<index>
    there; a colon is no job id's)."""
    return f"-{index}"
