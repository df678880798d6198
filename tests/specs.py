"""Specs the spec tests share: BASE, the least a valid spec says, and BAD_SPECS, specs each refused with the error
that names its field (parse_spec's in tests/model/test_spec.py; `jobplane validate`'s in
tests/cli/test_cli_validate.py)."""

from __future__ import annotations

BASE = "run: python3 train.py\ninstance_type: g5.xlarge\n"

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
