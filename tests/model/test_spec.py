"""Job spec parsing: every error names the field and what is allowed."""

from __future__ import annotations

import pytest

from jobplane.model.bounds import format_duration, parse_duration
from jobplane.model.errors import SpecError
from jobplane.model.spec import job_id_problem, parse_spec
from jobplane.model.specfields import StopOn, hp_string
from tests.specs import BAD_SPECS, BASE


def errors_of(doc: str, job_id: str | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc, job_id=job_id)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("90s", 90), ("30m", 1800), ("8h", 28800), ("2d", 172800), (3600, 3600), ("45", 45), (" 5 m ", 300)],
)
def test_durations(value: object, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["5 parsecs", "1.5h", "-3s", 0, True, "", "h"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_format_duration_round_trips() -> None:
    for seconds in (90, 1800, 28800, 172800, 61):
        assert parse_duration(format_duration(seconds)) == seconds


def test_minimal_spec_gets_defaults() -> None:
    spec = parse_spec(BASE)
    assert spec.cloud == "aws" and spec.num_nodes == 1 and spec.instance_types == ["g5.xlarge"]
    assert spec.checkpoint_dir == "/opt/ml/checkpoints"


def test_json_is_accepted_and_id_comes_from_file_name() -> None:
    spec = parse_spec('{"run": "x", "instance_type": ["a1.large", "a1.xlarge"]}', job_id="my-job")
    assert spec.id == "my-job" and spec.instance_types == ["a1.large", "a1.xlarge"]


@pytest.mark.parametrize(("doc", "expected"), BAD_SPECS)
def test_errors_name_the_field(doc: str, expected: str) -> None:
    assert any(e.startswith(expected) for e in errors_of(doc)), errors_of(doc)


def test_every_error_is_reported_at_once() -> None:
    errors = errors_of("cloud: gcp\nnum_nodes: 0\ncode: s3://b/c\nbogus: 1\ninstance_type: n1-standard-4\n")
    assert {e.split(":")[0] for e in errors} == {"num_nodes", "code", "bogus", "run"}


def test_file_name_id_must_be_valid_and_agree() -> None:
    assert errors_of(BASE, job_id="Bad_ID")[0].startswith("id: 'Bad_ID' is not a valid job id")
    assert "differs from the file name" in errors_of(BASE + "id: other\n", job_id="mine")[0]


@pytest.mark.parametrize("job_id", ["a", "job-1", "a" * 63, "x9"])
def test_good_ids(job_id: str) -> None:
    assert job_id_problem(job_id) is None


@pytest.mark.parametrize("job_id", ["", "1abc", "Bad_ID", "a" * 64, "ends-", "has.dot", "has/slash"])
def test_bad_ids(job_id: str) -> None:
    assert job_id_problem(job_id)


def test_env_scalars_become_strings() -> None:
    spec = parse_spec(BASE + "env: {LR: 0.1, STEPS: 10, DEBUG: true}\n")
    assert spec.env == {"LR": "0.1", "STEPS": "10", "DEBUG": "true"}


def test_training_fields_keep_sagemaker_shapes() -> None:
    spec = parse_spec(BASE + """
metrics:
  - {name: "train:loss", regex: 'loss ([0-9.eE+-]+|nan|inf)'}
  - {name: "validation:accuracy", regex: 'val_acc=(?:\\s*)([0-9.]+)'}
stop_on: {patterns: ['CUDA out of memory'], nan: true}
hyperparameters: {epochs: 10, lr: 0.01, optimizer: adam, amp: true, layers: [64, 32]}
""")
    assert [m.name for m in spec.metrics or []] == ["train:loss", "validation:accuracy"]
    assert spec.stop_on is not None and spec.stop_on.nan and spec.stop_on.patterns == ["CUDA out of memory"]
    assert spec.hyperparameters == {"epochs": 10, "lr": 0.01, "optimizer": "adam", "amp": True, "layers": [64, 32]}
    assert parse_spec(BASE).metrics is None and parse_spec(BASE + "metrics: []\n").metrics == []  # defaults vs none
    assert parse_spec(BASE + "stop_on: {nan: true}\n").stop_on == StopOn(nan=True)


def test_hyperparameters_as_sagemaker_hands_them_over() -> None:
    assert [hp_string(v) for v in (10, 0.01, "adam", True, [64, 32], {"b": 1, "a": 2})] == \
        ["10", "0.01", "adam", "true", "[64,32]", '{"a":2,"b":1}']
