"""Job spec parsing: every error names the field and what is allowed."""

from __future__ import annotations

import pytest

from jobplane.errors import SpecError
from jobplane.spec import StopOn, format_duration, job_id_problem, parse_duration, parse_spec
from jobplane.specfields import hp_string

BASE = "run: python3 train.py\ninstance_type: g5.xlarge\n"


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


# A bad spec and the first error it gets: the field's path, then why (jobplane validate prints the same lines).
BAD_SPECS = [
    (BASE + "num_nodse: 2\n", "num_nodse: unknown field (allowed: id, name,"),
    (BASE + "max_runtime: 5 parsecs\n", "max_runtime: invalid duration '5 parsecs'"),
    (BASE + "num_nodes: 0\n", "num_nodes: Input should be greater than or equal to 1"),
    (BASE + "id: Bad_ID\n", "id: 'Bad_ID' is not a valid job id"),
    (BASE + "cloud: azure\n", "cloud: Input should be 'aws' or 'gcp'"),
    (BASE + "cloud: gcp\ncode: s3://bucket/code.tar.gz\n", "code: 's3://bucket/code.tar.gz' must be a gs:// URI"),
    ("instance_type: g5.xlarge\n", "run: required field is missing"),
    (BASE + "inputs: {train: {uri: gs://x/y}}\n", "inputs.train.uri: 'gs://x/y' must be a s3:// URI"),
    (BASE + "inputs: {train: {uri: s3://x/y, distribution: sideways}}\n",
     "inputs.train.distribution: Input should be 'replicated' or 'sharded'"),
    (BASE + "inputs: {train: {uri: s3://x/y, mode: pipe}}\n", "inputs.train.mode: unknown field (allowed: uri,"),
    (BASE + "env: {1BAD: x}\n", "env.1BAD: '1BAD' is not a valid environment variable name"),
    (BASE + "env: {JOBPLANE_JOB_ID: x}\n", "env.JOBPLANE_JOB_ID: names starting with JOBPLANE_ are reserved"),
    (BASE + "labels: {Team: ml}\n", "labels.Team: 'Team' is not a valid label key"),
    (BASE + "owner: alice@example.com\n", "owner: 'alice@example.com' is not a valid owner"),
    (BASE + "checkpoint_dir: ckpt\n", "checkpoint_dir: 'ckpt' must be an absolute path"),
    (BASE + "code: ./src\n", "code: './src' is a local path: submit it with `jobplane submit --code DIR`"),
    ("run: x\ninstance_type: []\n", "instance_type: the list is empty"),
    ("run: x\ninstance_type: [g5.xlarge, G5]\n", "instance_type[1]: 'G5' is not a valid instance type"),
    (BASE + "metrics: [{name: loss, regex: 'loss (\\S+)'}, {name: acc, regex: 'acc [0-9.]+'}]\n",
     "metrics[1].regex: 'acc [0-9.]+' has 0 capture groups; it needs exactly 1"),
    (BASE + "metrics: [{name: loss, regex: '(loss) (\\S+)'}]\n", "metrics[0].regex: '(loss) (\\S+)' has 2 capture"),
    (BASE + "metrics: [{name: loss, regex: 'loss ([0-9.]+'}]\n",
     "metrics[0].regex: 'loss ([0-9.]+' is not a valid regular expression: missing ), unterminated subpattern"),
    (BASE + "metrics: [{name: loss, regex: ''}]\n", "metrics[0].regex: String should have at least 1 character"),
    (BASE + "metrics: [{name: loss, regex: 'loss (.+)', type: gauge}]\n",
     "metrics[0].type: unknown field (allowed: name, regex)"),
    (BASE + "metrics: [{name: \"a\\tb\", regex: 'x (.+)'}]\n",
     "metrics[0].name: 'a\\tb' is not a valid metric name"),
    (BASE + "metrics: [{name: loss, regex: 'loss (.+)'}, {name: loss, regex: 'l (.+)'}]\n",
     "metrics[1].name: 'loss' is defined twice (also metrics[0])"),
    (BASE + "metrics: [{regex: 'loss (.+)'}]\n", "metrics[0].name: required field is missing"),
    (BASE + "stop_on: {patterns: ['CUDA error', '[unclosed']}\n",
     "stop_on.patterns[1]: '[unclosed' is not a valid regular expression"),
    (BASE + "stop_on: {nan: maybe}\n", "stop_on.nan: Input should be a valid boolean"),
    (BASE + "stop_on: {on_nan: true}\n", "stop_on.on_nan: unknown field (allowed: patterns, nan)"),
    (BASE + "hyperparameters: {1lr: 0.1}\n", "hyperparameters.1lr: '1lr' is not a valid hyperparameter name"),
    (BASE + "hyperparameters: {lr: 0.1, LR: 0.2}\n", "hyperparameters.LR: becomes SM_HP_LR, as 'lr' does"),
    (BASE + "hyperparameters: {text: " + "x" * 2501 + "}\n",
     "hyperparameters.text: the value is 2501 characters as a string; at most 2500"),
    ("- just\n- a list\n", "(spec): spec must be a mapping of fields, got list"),
    ("run: [unclosed\n", "(spec): not valid YAML or JSON"),
]


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
