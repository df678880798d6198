"""README.md and the docs/ pages stay true to the code (the site's strict build is `make docs`, in `make test`).

- docs/spec.md names every field of the job spec's JSON Schema, nested ones included, and its field table is
  the one generated from the schema (`python -m tests.test_docs` rewrites it).
- Every command in a shell code block (```bash, ```console `$ ` lines, ...) is run by the demo or a test:
  `jobplane VERB --flag` by a call in shared/jobplane/local/demo.py or tests/ that passes VERB and that flag;
  `make TARGET` by .ci/run, directly or as a prerequisite; anything else word for word by a test. A command
  that cannot run here (it needs a cloud account, or is a benchmark) may stand only in a code block with a
  title (```bash title="Needs an AWS account"), and only if NOT_RUN_HERE lists it with why and the test that
  covers the nearest thing.
- `jobplane ...` and `make ...` in inline code name commands, flags and targets that exist.
- A YAML block titled with a file of examples/ is that file, and the README stays under 200 lines.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import click
import pytest
from markdown.extensions.toc import slugify  # type: ignore[import-untyped]  # no stubs; mkdocs makes anchors with it

from jobplane.cli import cli
from jobplane.model.bounds import format_duration
from jobplane.model.spec import json_schema

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SPEC_PAGE = ROOT / "docs" / "spec.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# Where a command counts as run: the demo (CI runs both) and the tests. Not this file: it only names them.
RUNNERS = [ROOT / "shared" / "jobplane" / "local" / "demo.py",
           *sorted(p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py")]
SHELLS = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class NotRun:
    why: str  # why CI cannot run it
    nearest: str  # "path::name" of what runs the nearest thing


NOT_RUN_HERE: dict[str, NotRun] = {
    # AWS
    'make deploy CDK_ARGS="-c jobplane:notifyEmail=ml@example.com"': NotRun(
        "cdk bootstrap and cdk deploy into an AWS account",
        "tests/infra/conftest.py::synthesize"),  # the same stack, synthesized with cdk-nag as app.py does
    "make synth": NotRun(
        "a second synthesis through app.py would add a minute to make test; needs no account",
        "tests/infra/conftest.py::synthesize"),
    "make destroy": NotRun(
        "cdk destroy of a deployed stack",
        "tests/infra/test_template.py::test_registry_bucket_is_versioned_private_encrypted_logged_and_emits_events"),
    "aws s3 cp job.yaml s3://BUCKET/queue/TEAM/": NotRun(
        "writes to a real bucket",
        "tests/control/launcher/test_owners.py::test_the_drops_folder_is_the_owner_on_the_record_and_the_instances"),
    "aws s3 rb s3://BUCKET --force": NotRun(
        "deletes a real bucket",
        "tests/infra/test_template.py::test_registry_bucket_is_versioned_private_encrypted_logged_and_emits_events"),
    # Google Cloud
    "make gcp-package": NotRun(
        "builds the agent bundles from PyPI for every VM Python and architecture, for terraform apply only",
        "tests/gcp/test_terraform.py::test_the_function_zip_imports_from_itself_without_aws"),
    "cd infra/gcp && terraform init": NotRun(
        "downloads the Google provider from the Terraform registry",
        "tests/gcp/test_terraform.py::test_terraform_validates_with_the_google_provider"),
    "terraform apply -var project=MY_PROJECT -var region=us-central1": NotRun(
        "creates the deployment in a Google Cloud project",
        "tests/gcp/test_terraform.py::test_every_resource_the_deploy_page_promises_exists"),
    "terraform apply -var project=MY_PROJECT -var region=us-central1 -var 'data_buckets=[\"my-datasets\"]'": NotRun(
        "creates the deployment in a Google Cloud project",
        "tests/gcp/test_terraform.py::test_vms_may_read_the_data_buckets_listed_and_only_read"),
    'export JOBPLANE_BUCKET="$(terraform output -raw registry)" JOBPLANE_REGION=us-central1 '
    "GOOGLE_CLOUD_PROJECT=MY_PROJECT": NotRun(
        "reads the outputs of an applied deployment",
        "tests/gcp/test_terraform.py::test_outputs_and_terraform_fmt"),
    "jobplane submit ../../examples/gcp-spot.yaml --code ../../examples/train -f": NotRun(
        "launches a GPU VM in the deployment",
        "shared/jobplane/local/demo.py::happy_path"),  # make demo CLOUD=gcp submits examples/gcp/demo.yaml so
    "gcloud storage cp job.yaml gs://BUCKET/queue/TEAM/": NotRun(
        "writes to a real bucket",
        "tests/gcp/test_functions.py::test_a_queue_drop_launches_the_job_once_even_when_delivered_twice"),
    "terraform destroy -var project=MY_PROJECT -var region=us-central1": NotRun(
        "deletes the deployment",
        "tests/gcp/test_terraform.py::test_registry_bucket_is_versioned_uniform_and_never_public"),
    # Benchmarks: minutes of load each, and they rewrite bench/results/; the tests check what they measure
    ".venv/bin/python bench/check.py": NotRun(
        "a benchmark (N = 100, 1,000, 5,000 jobs in moto)",
        "tests/control/reconcile/test_apply_moto.py::test_lifecycle_started_then_healthy_then_finished"),
    ".venv/bin/python bench/admission.py": NotRun(
        "a benchmark (N = 100, 1,000 jobs waiting, on the memory cloud)",
        "tests/control/launcher/test_admission_bench.py::test_admission_costs_the_same_calls_with_3_or_12_jobs_waiting"),
    ".venv/bin/python bench/gcp_check.py": NotRun(
        "a benchmark (N = 100, 1,000 jobs on the GCS and Compute fakes)",
        "tests/gcp/test_functions.py::test_scheduled_functions_answer_with_their_actions"),
    ".venv/bin/python bench/lambda_idle.py": NotRun(
        "a benchmark (20 warm runs of each handler)",
        "tests/control/reconcile/test_handlers.py::test_sweeper_cron_then_exit_report_event"),
    ".venv/bin/python bench/gcp_idle.py": NotRun(
        "a benchmark (20 warm runs of each function)",
        "tests/gcp/test_functions.py::test_scheduled_functions_answer_with_their_actions"),
    ".venv/bin/python bench/metrics_extract.py": NotRun(
        "a benchmark (200,000 lines, best of several runs)",
        "tests/model/test_metrics.py::test_default_metrics_line_by_line"),
    ".venv/bin/python bench/system_metrics.py": NotRun(
        "a benchmark (200 samples of three cases; tests run it at 3)",
        "tests/agent/test_system_metrics.py::test_the_sampling_bench_runs_at_a_tiny_size"),
    ".venv/bin/python bench/trials_plan.py": NotRun(
        "a benchmark (plans over 100, 500 and 900 finished trials, best of three)",
        "tests/decide/test_sweep_trials.py::test_bayesian_concentrates_near_the_optimum_better_than_random"),
    ".venv/bin/python bench/sweep_reconcile.py": NotRun(
        "a benchmark (sweeps of 12 and 100 trials with 36 and 360 metric chunks each)",
        "tests/sweeps/test_sweep_curves.py::test_a_curve_is_read_chunk_by_chunk_once_and_not_at_all_once_complete"),
    ".venv/bin/python bench/big_checkpoint.py": NotRun(
        "a benchmark (six preemptions of an 800 MiB checkpoint saved in place, then 90 s of training, 2 busy loops)",
        "tests/agent/test_big_checkpoints.py::"
        "test_a_big_checkpoint_saved_in_place_and_preempted_at_random_restores_whole_and_recent"),
    ".venv/bin/python bench/stop_time.py --job trainer --python /tmp/trainer-venv/bin/python": NotRun(
        "a benchmark (twelve stops of a real Hugging Face Trainer, which needs transformers in another venv)",
        "tests/agent/test_checkpoint_writers.py::"
        "test_the_freeze_reads_the_group_before_the_signal_and_every_other_process_after_it"),
    ".venv/bin/python bench/cold_start.py --rounds 11": NotRun(
        "a benchmark (11 rounds of fresh interpreters, as bench/results/cold-start.json was measured)",
        "tests/control/launcher/test_cold_start.py::test_a_handler_imports_only_what_every_run_needs"),
    ".venv/bin/python bench/transfer.py --baseline /tmp/main": NotRun(
        "a benchmark (2 GiB and 2,000 files on rclone serve s3 beside s5cmd, the AWS CLI and boto3, three samples)",
        "tests/test_bench.py::test_a_bench_script_measures_something_at_a_tiny_size"),
    ".venv/bin/python bench/transfer.py --clouds gcs --big-mib 1024 --baseline /tmp/main": NotRun(
        "a benchmark (1 GiB and 2,000 files on the GCS fake, three samples)",
        "tests/test_bench.py::test_a_bench_script_measures_something_at_a_tiny_size"),
    ".venv/bin/python bench/queue_scale.py": NotRun(
        "a benchmark (Kueue's baseline: 15,000 jobs in virtual time, an hour and more of CPU; then two variants)",
        "tests/test_bench.py::test_a_bench_script_measures_something_at_a_tiny_size"),
    ".venv/bin/python bench/render.py": NotRun(
        "rewrites docs/benchmarks.md's tables from bench/results/",
        "tests/test_bench.py::test_the_benchmarks_page_is_what_the_committed_json_makes"),
}


# ---- code blocks ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    title: str | None
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    fence: str | None = None
    lang, title, start, body = "", None, 0, list[str]()
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if fence is None:
            if m := re.match(r"(`{3,}|~{3,})\s*(\S*)(.*)$", stripped):
                fence, lang, start, body = m.group(1), m.group(2).lower(), number, []
                title = t.group(1) if (t := re.search(r'title="([^"]*)"', m.group(3))) else None
        elif stripped.startswith(fence) and not stripped.strip(fence[0]):
            yield Block(page, start, lang, title, "\n".join(body))
            fence = None
        else:
            body.append(line)


def commands(block: Block) -> list[str]:
    """Each command line of a shell block: `$ ` lines of a console block, every other line of a bash block;
    continuation lines joined, comments and the console prompt left out, whitespace collapsed."""
    lines: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw.strip()
        if pending:
            line = pending + " " + line
        elif block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        pending = ""
        line = re.sub(r"(^|\s)#\s.*$", "", line).strip()  # a comment: `#` then a space, as the docs write them
        if line:
            lines.append(" ".join(line.split()))
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """The words of each command in a line (split at ;, &&, || and |), leading VAR=value assignments left out."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in (";", "&&", "||", "|"):
            out.append([])
        elif out[-1] or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            out[-1].append(token)
    return [words for words in out if words]


def shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.lang in SHELLS]


# ---- what runs them --------------------------------------------------------------------------------------------
@cache
def calls() -> list[tuple[str, tuple[str, ...]]]:
    """The string literals passed together in each call, list or tuple of the demo and the tests: ("submit",
    "--code", "-f") for `cloud.cli("submit", spec, "--code", code, "-f")`."""
    found = []
    for path in RUNNERS:
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.args if isinstance(node, ast.Call) else node.elts if isinstance(node, ast.List | ast.Tuple) \
                else []
            words = tuple(a.value for a in items if isinstance(a, ast.Constant) and isinstance(a.value, str))
            if words:
                found.append((str(path.relative_to(ROOT)), words))
    return found


@cache
def runner_sources() -> str:
    return "\n".join(p.read_text() for p in RUNNERS)


def resolve(words: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """`jobplane local preempt JOB --grace 10` -> (["local", "preempt"], its click command, ["--grace"])."""
    command: click.Command = cli
    path: list[str] = []
    for word in words[1:]:
        if isinstance(command, click.Group) and word in command.commands:
            command = command.commands[word]
            path.append(word)
        elif not word.startswith("-"):
            break
    flags = [w.split("=", 1)[0] for w in words[1:] if w.startswith("-") and w != "-"]
    return path, command, flags


def option(command: click.Command, flag: str) -> click.Parameter | None:
    return next((p for p in command.params if flag in (*p.opts, *p.secondary_opts)), None)


def contains(words: tuple[str, ...], path: list[str]) -> bool:
    return any(list(words[i:i + len(path)]) == path for i in range(len(words) - len(path) + 1))


def jobplane_problems(words: list[str]) -> list[str]:
    path, command, flags = resolve(words)
    if not path:
        return ["names no jobplane command"]
    problems = [f"--{flag.lstrip('-')} is not an option of `jobplane {' '.join(path)}`" for flag in flags
                if option(command, flag) is None]
    runs = [(where, w) for where, w in calls() if contains(w, path)]
    if not runs:
        problems.append(f"no test or demo runs `jobplane {' '.join(path)}`")
    for flag in flags:
        param = option(command, flag)
        names = (*param.opts, *param.secondary_opts) if param else (flag,)
        if not any(any(w.split("=", 1)[0] in names for w in passed) for _, passed in runs):
            problems.append(f"no test or demo runs `jobplane {' '.join(path)}` with {flag}")
    for spec in (w for w in words if w.endswith((".yaml", ".yml")) and "examples/" in w):
        example = ROOT / "examples" / spec.split("examples/", 1)[1]
        if not example.exists():
            problems.append(f"{spec} does not exist")
        elif path == ["submit"] and example.name not in runner_sources():
            problems.append(f"no test or demo submits {example.name}")
    return problems


@cache
def makefile() -> dict[str, list[str]]:
    """Each Makefile target and its prerequisites, with the targets its recipe runs through `$(MAKE)`."""
    targets: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (ROOT / "Makefile").read_text().splitlines():
        if (m := re.match(r"^([A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*)\s*:(?!=)(.*)$", line)) and \
                not m.group(1).startswith("."):
            current = m.group(1).split()
            for target in current:
                targets[target] = m.group(2).split()
        elif line.startswith("\t") and "$(MAKE)" in line:
            run = [w for w in line.split("$(MAKE)", 1)[1].split() if not w.startswith("-") and "=" not in w]
            for target in current:
                targets[target] += run
    return targets


def ci_lines() -> list[str]:
    return [" ".join(line.split()) for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.startswith("make ")]


def make_problems(line: str, words: list[str]) -> list[str]:
    targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w] or ["test"]  # test: the first
    problems = [f"the Makefile has no target {t}" for t in targets if t not in makefile()]
    if problems:
        return problems
    if any("=" in w for w in words[1:]):  # with variables, only the same command counts
        return [] if line in ci_lines() else [f"`{line}` is not in .ci/run"]
    reached, todo = set(), [w for ci in ci_lines() for w in ci.split()[1:] if "=" not in w]
    while todo:
        target = todo.pop()
        if target not in reached:
            reached.add(target)
            todo += makefile().get(target, [])
    tested = {t for _, words in calls() if "make" in words for t in words}
    return [f"neither .ci/run nor a test runs `make {t}`" for t in targets if t not in reached | tested]


def problems_of(line: str) -> list[str]:
    problems = []
    for words in simple_commands(line):
        if words[0] == "jobplane":
            problems += jobplane_problems(words)
        elif words[0] == "make":
            problems += make_problems(" ".join(words), words)
        elif shlex.join(words) not in runner_sources() and " ".join(words) not in runner_sources():
            problems.append(f"no test runs `{' '.join(words)}`")
    return problems


# ---- the checks ------------------------------------------------------------------------------------------------
def test_every_command_in_a_shell_block_is_run_by_the_demo_or_a_test() -> None:
    found = [(block, line) for block in shell_blocks() for line in commands(block)]
    assert len(found) >= 20, "the parser found too few commands"
    unrun = []
    for block, line in found:
        if block.title is not None and line in NOT_RUN_HERE:
            continue
        why = problems_of(line)
        if line in NOT_RUN_HERE:
            why.append("listed in NOT_RUN_HERE: it belongs in a titled block (```bash title=\"Needs ...\")")
        unrun += [f"{block.where()}: `{line}`: {problem}" for problem in why]
    assert not unrun, "\n".join(unrun)


def test_each_command_not_run_here_is_shown_and_its_nearest_test_exists() -> None:
    shown = {line for block in shell_blocks() if block.title is not None for line in commands(block)}
    assert not set(NOT_RUN_HERE) - shown, f"listed but shown in no titled block: {set(NOT_RUN_HERE) - shown}"
    for command, not_run in NOT_RUN_HERE.items():
        path, name = not_run.nearest.split("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"def {name}\b", source), f"{command}: {not_run.nearest} does not exist"


def test_inline_commands_name_what_exists() -> None:
    wrong = []
    for page in PAGES:
        text = re.sub(r"^\s*(```|~~~).*?^\s*\1", "", page.read_text(), flags=re.S | re.M)  # inline code only
        for code in re.findall(r"`([^`\n]+)`", text):
            words = code.replace("[", " ").replace("]", " ").split()
            if words[:1] == ["jobplane"] and len(words) > 1 and words[1].isalpha() and words[1].islower():
                path, command, flags = resolve([w for w in words if w not in ("-h", "--help")])
                if not path:
                    wrong.append(f"{page.name}: `{code}` names no jobplane command")
                wrong += [f"{page.name}: `{code}`: no option {f}" for f in flags if option(command, f) is None]
            elif words[:1] == ["make"] and len(words) > 1:
                wrong += [f"{page.name}: `{code}`: no target {t}" for t in words[1:]
                          if "=" not in t and not t.startswith("-") and t not in makefile()]
    assert not wrong, "\n".join(wrong)


def test_shell_blocks_parse_as_the_check_expects() -> None:
    """The parser the checks above rest on: prompts, output, comments, continuations, chains."""
    console = Block(README, 1, "console", None, "$ jobplane ls --all  # every job\n ID  STATE\n$ make \\\n  demo")
    assert commands(console) == ["jobplane ls --all", "make demo"]
    bash = Block(README, 1, "bash", None, "# a comment\ncd infra/gcp && terraform init   # init\n\nX=1 make test")
    assert commands(bash) == ["cd infra/gcp && terraform init", "X=1 make test"]
    assert simple_commands("cd infra/gcp && X=1 make test | tee out") == [["cd", "infra/gcp"], ["make", "test"],
                                                                          ["tee", "out"]]
    assert jobplane_problems(["jobplane", "logs", "ID", "--follow", "--nope"])[0].startswith("--nope is not")
    assert make_problems("make demo CLOUD=azure", ["make", "demo", "CLOUD=azure"]) == [
        "`make demo CLOUD=azure` is not in .ci/run"]
    assert make_problems("make docs", ["make", "docs"]) == []  # a prerequisite of make test


def test_yaml_blocks_titled_with_an_example_are_that_example() -> None:
    titled = [b for page in PAGES for b in blocks(page) if b.lang == "yaml" and (b.title or "").startswith("examples/")]
    assert titled
    for block in titled:
        assert block.text + "\n" == (ROOT / str(block.title)).read_text(), f"{block.where()} differs from {block.title}"


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+\s+(.+)$", (ROOT / path).read_text(), flags=re.M)
            assert anchor in {slugify(h.replace("`", ""), "-") for h in headings}, f"README: no #{anchor} in {path}"


# ---- docs/spec.md's field table, from the JSON Schema --------------------------------------------------------
# Fields the schema gives no description yet (say it in shared/jobplane/model/spec.py and drop it here).
NOTES = {
    "cloud": "the deployment's cloud; a spec for the other one is recorded INVALID",
    "region": "the deployment's region, if given; a spec for another is recorded INVALID",
    "env": "environment variables for `setup` and `run`; names starting with `JOBPLANE_` are reserved",
    "inputs": "data channels by name, downloaded to `/opt/ml/input/data/<name>` (`SM_CHANNEL_<NAME>`)",
    "checkpoint_dir": "synced to the bucket, restored on a rerun (`JOBPLANE_CHECKPOINT_DIR`)",
    "artifacts_dir": "uploaded to `jobs/<id>/artifacts/model/` when the job ends (`SM_MODEL_DIR`)",
    "disk_gb": "boot disk size of each VM, in GB",
    "master_port": "`MASTER_PORT` of the job's rank 0, for torchrun and torch.distributed",
    "owner": "the team the job belongs to: the `queue/` folder it is dropped in (`queue/` itself: `default`)",
    "labels": "tags on the job's VMs and cost rows (`jobplane cost --by label:KEY`); no `jobplane-` keys; "
              "`array`, `sweep` and `trial` are jobplane's, on the members it makes",
}
BEGIN = "<!-- fields: generated from the JSON Schema by `python -m tests.test_docs`; do not edit by hand -->"
END = "<!-- fields: end -->"


def schema_fields(schema: dict[str, Any]) -> dict[str, tuple[dict[str, Any], bool]]:
    """Every property by path (`stop_on.nan`, `inputs.<name>.uri`, `metrics[].regex`), in the schema's order,
    with whether it is required."""
    defs = schema.get("$defs", {})
    out: dict[str, tuple[dict[str, Any], bool]] = {}

    def visit(node: dict[str, Any], path: str) -> None:
        node = deref(node, defs)
        for alternative in node.get("anyOf", []):
            visit(alternative, path)
        if "items" in node:
            visit(node["items"], path + "[]")
        for value in node.get("patternProperties", {}).values():
            visit(value, path + ".<name>")
        for name, prop in node.get("properties", {}).items():
            child = f"{path}.{name}" if path else name
            out[child] = (prop, name in node.get("required", []))
            visit(prop, child)

    visit(schema, "")
    return out


def deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    return node


def type_of(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = deref(node, defs)
    alternatives = [a for a in node.get("anyOf", []) if a.get("type") != "null"]
    if {a.get("type") for a in alternatives} == {"integer", "string"} and "[smhd]" in str(alternatives):
        return "duration"  # jobplane.model.bounds.Duration: 3600, "90s", "30m", "8h", "2d"
    if alternatives:
        return " or ".join(dict.fromkeys(type_of(a, defs) for a in alternatives))
    if "enum" in node:
        return " or ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {type_of(node['items'], defs)}"
    if kind == "object" and "patternProperties" in node:
        (value,) = node["patternProperties"].values()
        return f"map of {type_of(value, defs)}"
    if kind == "object":
        return "mapping (below)"
    return str(kind) if kind else "any JSON value"


def limits(node: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    node = deref(node, defs)
    said = [f"{node['minimum']} to {node['maximum']}"] if "minimum" in node and "maximum" in node else []
    said += [f"at most {node[k]:,} {what}" for k, what in (("maxLength", "characters"), ("maxItems", "items"),
                                                             ("maxProperties", "entries")) if k in node]
    if node.get("type") == "string" and "pattern" in node:
        said.append(f"pattern `{node['pattern']}`")
    for key, value in node.get("patternProperties", {}).items():
        said.append(f"keys `{key}`")
        if "pattern" in value:
            said.append(f"values `{value['pattern']}`")
    for alternative in node.get("anyOf", []):
        said += [s for s in limits(alternative, defs) if s not in said]
    return said


def ceiling(node: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """A duration's ceiling (jobplane.model.bounds.AtMost puts it on the form in seconds), as a spec would write it."""
    node = deref(node, defs)
    if node.get("type") == "integer" and "maximum" in node:
        return [f"at most {format_duration(node['maximum'])}"]
    return next((said for a in node.get("anyOf", []) if (said := ceiling(a, defs))), [])


def default_of(node: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in node:
        return "empty"
    value = node["default"]
    return "unset" if value is None else f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def field_table() -> str:
    schema = json_schema()
    defs = schema.get("$defs", {})
    rows = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for path, (node, required) in schema_fields(schema).items():
        # the schema's prose as text (`<NAME>` is no HTML tag), the notes and limits as written
        described = node.get("description", "").replace("<", "&lt;").replace(">", "&gt;") or NOTES.get(path, "")
        said = [described, *(ceiling(node, defs) if type_of(node, defs) == "duration" else limits(node, defs))]
        text = "; ".join(s for s in said if s).replace("|", "\\|")
        rows.append(f"| `{path}` | {type_of(node, defs)} | {default_of(node, required)} | {text} |")
    return "\n".join([BEGIN, "", *rows, "", END])


def generated_section(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_every_schema_field_is_named_in_spec_md() -> None:
    fields = schema_fields(json_schema())
    assert {"run", "stop_on.nan", "inputs.<name>.uri", "metrics[].regex"} <= set(fields)
    page = SPEC_PAGE.read_text()
    assert [f for f in fields if f"`{f}`" not in page] == []


def test_spec_md_field_table_is_generated_from_the_schema() -> None:
    assert generated_section(SPEC_PAGE.read_text()) == field_table(), "run `python -m tests.test_docs`"


def test_notes_only_fill_in_missing_descriptions() -> None:
    fields = schema_fields(json_schema())
    assert [path for path in NOTES if path not in fields or fields[path][0].get("description")] == []


def write_field_table() -> None:
    text = SPEC_PAGE.read_text()
    SPEC_PAGE.write_text(text.replace(generated_section(text), field_table()))


if __name__ == "__main__":
    write_field_table()
    sys.exit(0)
