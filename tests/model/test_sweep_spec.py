"""A spec's `sweep:` section: every mistake names its field; the section round-trips through job.json."""

from __future__ import annotations

import pytest

from jobplane.model.errors import SpecError
from jobplane.model.policy import check_against_policy, parse_policy
from jobplane.model.spec import JobSpec, known_fields, parse_spec, spec_to_json
from jobplane.model.sweepspec import Distribution

BASE = "run: python3 train.py\ninstance_type: g5.xlarge\n"
METRICS = "metrics: [{name: 'val:loss', regex: 'val_loss ([0-9.eE+-]+)'}]\n"
ISSUE_EXAMPLE = BASE + METRICS + """
sweep:
  parameters:
    lr: {loguniform: [1.0e-4, 1.0e-1]}
    batch_size: {choice: [32, 64, 128]}
    warmup: {int: [0, 1000]}
  strategy: random
  max_trials: 24
  max_parallel: 4
  objective: {metric: "val:loss", goal: minimize}
  early_stop: {rule: median, after_step: 200}
  seed: 7
"""


def sweep_doc(body: str, head: str = BASE + METRICS) -> str:
    """A spec whose sweep section is body (indented under sweep:), with an objective unless body has one."""
    lines = body.strip("\n").splitlines()
    if not any(line.startswith("objective:") for line in lines):
        lines.append("objective: {metric: 'val:loss', goal: minimize}")
    return head + "sweep:\n" + "".join(f"  {line}\n" for line in lines)


def errors_of(doc: str, job_id: str | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc, job_id=job_id)
    return [str(e) for e in info.value.errors]


def test_the_issue_example_parses() -> None:
    spec = parse_spec(ISSUE_EXAMPLE, job_id="search")
    sweep = spec.sweep
    assert sweep is not None
    assert sweep.parameters["lr"] == Distribution(loguniform=(1e-4, 0.1))
    assert sweep.parameters["batch_size"].choice == [32, 64, 128]
    assert sweep.parameters["warmup"].integer == (0, 1000) and sweep.parameters["warmup"].size == 1001
    assert (sweep.strategy, sweep.max_trials, sweep.max_parallel, sweep.seed) == ("random", 24, 4, 7)
    assert sweep.objective.metric == "val:loss" and sweep.objective.goal == "minimize"
    assert sweep.early_stop is not None and (sweep.early_stop.rule, sweep.early_stop.after_step) == ("median", 200)


def test_the_section_round_trips_through_job_json() -> None:
    spec = parse_spec(ISSUE_EXAMPLE, job_id="search")
    stored = spec_to_json(spec)
    assert stored["sweep"]["parameters"]["warmup"] == {"int": [0, 1000]}  # the alias, as the user wrote it
    assert JobSpec.model_validate(stored) == spec
    newer = {**stored, "sweep": {**stored["sweep"], "pruner": "x", "objective": {"metric": "val:loss",
                                                                                  "goal": "minimize", "w": 1}}}
    assert JobSpec.model_validate(known_fields(newer)) == spec


def test_grid_defaults_to_its_size_and_steps_make_ranges_finite() -> None:
    spec = parse_spec(sweep_doc("""
strategy: grid
parameters:
  lr: {loguniform: [1.0e-3, 1.0e-1], steps: 3}
  depth: {int: [2, 4]}
  opt: {choice: [adam, sgd]}
"""))
    assert spec.sweep is not None and spec.sweep.grid_size == 18 and spec.sweep.trial_count == 18
    lr = spec.sweep.parameters["lr"]
    assert [lr.point(i) for i in range(3)] == [0.001, 0.01, 0.1]
    assert [Distribution(uniform=(0, 1), steps=5).point(i) for i in range(5)] == [0, 0.25, 0.5, 0.75, 1]


# A bad sweep section and an error it gets: the field's path, then why.
BAD_SWEEPS = [
    ("parameters: {lr: {normal: [0, 1]}}\nmax_trials: 4",
     "sweep.parameters.lr: unknown distribution 'normal': use {uniform: [lo, hi]}"),
    ("parameters: {lr: {uniform: [0, 1], choice: [1]}}\nmax_trials: 4",
     "sweep.parameters.lr: give exactly one of uniform, loguniform, int, choice, not uniform and choice"),
    ("parameters: {lr: {}}\nmax_trials: 4", "sweep.parameters.lr: give exactly one of"),
    ("parameters: {lr: 0.1}\nmax_trials: 4", "sweep.parameters.lr: give a distribution"),
    ("parameters: {batch_size: {choice: []}}\nmax_trials: 4",
     "sweep.parameters.batch_size.choice: List should have at least 1 item"),
    ("parameters: {lr: {loguniform: [0, 1]}}\nmax_trials: 4", "sweep.parameters.lr: loguniform: lo must be above 0"),
    ("parameters: {lr: {uniform: [1, 0]}}\nmax_trials: 4", "sweep.parameters.lr: uniform: [lo, hi] needs finite"),
    ("parameters: {lr: {uniform: [0, .inf]}}\nmax_trials: 4", "sweep.parameters.lr: uniform: [lo, hi] needs finite"),
    ("parameters: {n: {int: [5, 1]}}\nmax_trials: 4", "sweep.parameters.n: int: [lo, hi] needs lo <= hi"),
    ("parameters: {n: {int: [1, 5], steps: 3}}\nmax_trials: 4", "sweep.parameters.n: steps: only for uniform"),
    ("parameters: {lr: {uniform: [0, 1], steps: 1}}\nmax_trials: 4",
     "sweep.parameters.lr.steps: Input should be greater than or equal to 2"),
    ("parameters: {}\nmax_trials: 4", "sweep.parameters: Dictionary should have at least 1 item"),
    ("parameters: {1lr: {uniform: [0, 1]}}\nmax_trials: 4",
     "sweep.parameters.1lr: '1lr' is not a valid hyperparameter name"),
    ("parameters: {lr: {uniform: [0, 1]}}", "sweep.max_trials: required with strategy random"),
    ("parameters: {lr: {uniform: [0, 1]}}\nmax_trials: 1001", "sweep.max_trials: Input should be less than or equal"),
    ("parameters: {lr: {uniform: [0, 1]}}\nmax_trials: 4\nmax_parallel: 5",
     "sweep.max_parallel: 5 exceeds the 4 trials of the sweep"),
    ("parameters: {lr: {uniform: [0, 1]}}\nmax_trials: 400\nmax_parallel: 101",
     "sweep.max_parallel: Input should be less than or equal to 100"),
    ("parameters: {lr: {uniform: [0, 1]}}\nstrategy: grid",
     "sweep.parameters.lr: a grid needs a finite set: give uniform steps: N"),
    ("parameters: {n: {int: [1, 3]}}\nstrategy: grid\nmax_trials: 4", "sweep.max_trials: 4 exceeds the grid's 3"),
    ("parameters: {n: {int: [1, 100]}, m: {int: [1, 100]}}\nstrategy: grid",
     "sweep.max_trials: the grid has 10000 combinations, more than 1000 trials"),
    ("parameters: {n: {int: [1, 3]}}\nstrategy: hyperband\nmax_trials: 3",
     "sweep.strategy: Input should be 'grid', 'random' or 'bayesian'"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nobjective: {metric: 'val:acc', goal: maximize}",
     "sweep.objective.metric: 'val:acc' is not a metric the spec reads (it reads: val:loss); define it in metrics:"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nobjective: {metric: 'val:loss', goal: lower}",
     "sweep.objective.goal: Input should be 'minimize' or 'maximize'"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nobjective: {metric: 'val:loss'}",
     "sweep.objective.goal: required field is missing"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nearly_stop: {rule: hyperband}",
     "sweep.early_stop.rule: Input should be 'median' or 'asha'"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nearly_stop: {rule: asha}",
     "sweep.early_stop.after_step: asha's first rung: at least 1"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nearly_stop: {rule: median, after_step: -1}",
     "sweep.early_stop.after_step: Input should be greater than or equal to 0"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nseed: -1", "sweep.seed: Input should be greater than or equal"),
    ("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\ntrials: 3", "sweep.trials: unknown field (allowed: parameters,"),
    ("parameters: {lr: {uniform: [0, 1]}, LR: {uniform: [0, 1]}}\nmax_trials: 3",
     "sweep.parameters.LR: becomes SM_HP_LR, as 'lr' in sweep.parameters does"),
]


@pytest.mark.parametrize(("body", "expected"), BAD_SWEEPS)
def test_errors_name_the_field(body: str, expected: str) -> None:
    errors = errors_of(sweep_doc(body))
    assert any(e.startswith(expected) for e in errors), errors


def test_the_objective_is_checked_against_the_default_metrics_when_the_spec_names_none() -> None:
    assert parse_spec(sweep_doc("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nobjective: {metric: loss, goal: "
                                "minimize}", head=BASE)).sweep is not None
    errors = errors_of(sweep_doc("parameters: {n: {int: [1, 3]}}\nmax_trials: 3\nobjective: {metric: step, goal: "
                                 "maximize}", head=BASE))
    assert errors == ["sweep.objective.metric: 'step' is not a metric the spec reads (it reads: loss, accuracy, "
                      "learning_rate); define it in metrics:"]


def test_a_swept_parameter_is_not_also_fixed() -> None:
    errors = errors_of(sweep_doc("parameters: {lr: {uniform: [0, 1]}, Depth: {int: [1, 3]}}\nmax_trials: 3",
                                 head=BASE + METRICS + "hyperparameters: {lr: 0.1, depth: 2, epochs: 3}\n"))
    assert errors == ["sweep.parameters.lr: also set in hyperparameters: a swept parameter takes its value from the "
                      "sweep",
                      "sweep.parameters.Depth: becomes SM_HP_DEPTH, as 'depth' in hyperparameters does"]


def test_a_trial_keeps_within_the_spec_limits() -> None:
    labels = "labels: {" + ", ".join(f"l{i}: x" for i in range(31)) + ", sweep: mine}\n"
    errors = errors_of(sweep_doc("parameters: {n: {int: [1, 3]}}\nmax_trials: 3", head=BASE + METRICS + labels))
    assert errors == ["labels.sweep: set on every trial by the sweep",
                      "labels: a trial adds 2 labels (sweep, trial): at most 30 here"]
    hps = "hyperparameters: {" + ", ".join(f"h{i}: 1" for i in range(99)) + "}\n"
    errors = errors_of(sweep_doc("parameters: {n: {int: [1, 3]}, m: {int: [1, 3]}}\nmax_trials: 3",
                                 head=BASE + METRICS + hps))
    assert errors == ["sweep.parameters: 2 swept and 99 fixed hyperparameters: a trial takes at most 100"]


def test_the_sweep_id_leaves_room_for_its_trials_ids() -> None:
    doc = sweep_doc("parameters: {n: {int: [1, 3]}}\nmax_trials: 3")
    assert parse_spec(doc, job_id="s" * 58).sweep is not None  # s...s-t003: 63 characters
    assert errors_of(doc, job_id="s" * 59) == [
        f"id: {'s' * 59!r} is too long for a sweep: its trials are {'s' * 59}-t003..., at most 63 characters; "
        "use at most 58"]
    thousand = sweep_doc("parameters: {n: {uniform: [1, 3]}}\nmax_trials: 1000")
    assert errors_of(thousand, job_id="s" * 58)[0].endswith("use at most 57")


def test_max_parallel_above_the_owner_quota_is_a_policy_error() -> None:
    spec = parse_spec(sweep_doc("parameters: {n: {int: [1, 30]}}\nmax_trials: 30\nmax_parallel: 20",
                                head=BASE + METRICS + "num_nodes: 4\n"))
    assert check_against_policy(spec, parse_policy("max_active_instances_per_owner: 80\n")) == []
    [error] = check_against_policy(spec, parse_policy("max_active_instances_per_owner: 64\n"))
    assert str(error) == ("sweep.max_parallel: 20 trials of 4 node(s) at once can never fit the owner quota of 64 "
                          "active instances")


def test_debug_hold_is_refused_in_a_sweep_naming_the_field() -> None:
    """A held FAILED trial has ended for the sweep, which proposes the next while the hold keeps its VMs up (a day
    at most): the sweep's VMs would exceed max_parallel. One trial's failure is looked at as a job of its own."""
    doc = sweep_doc("parameters: {n: {int: [1, 3]}}\nmax_trials: 3", head=BASE + METRICS + "debug_hold: 30m\n")
    assert errors_of(doc) == ["debug_hold: not in a sweep: a failed trial's held VMs would run beside the next "
                              "trials, past sweep.max_parallel; submit the failed trial's parameters as a job with "
                              "debug_hold to look at it"]
    assert parse_spec(BASE + METRICS + "debug_hold: 30m\n").debug_hold == 1800  # a job's own stays
