"""The AWS handlers' cold start, checked without a clock: what a fresh interpreter loads to import each one.

Importing a handler loads what every one of its runs needs (a control function: the policy, read without pydantic,
the registry, the EC2 and S3 adapters; the vend function: the facts of a job's record, never the policy); what only
some runs need (a launch, a drop, a notice, a topic, a live sweep, a job's record and so pydantic) or none of them
(the other functions' rules, the CLI, the other cloud) is imported where it is used, so it costs nothing until then.
A module that creeps back into a handler's import fails here, deterministically; bench/cold_start.py times
the imports against bare boto3 + Powertools and reports the ratio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTROL = ("launcher", "sweeper", "rerun", "uptime_cap")
HANDLERS = (*CONTROL, "vend")

# Never in a Lambda's import: the CLI and its libraries, the local cloud, test tools, the other cloud's SDK.
NEVER = ("jobplane.cli", "jobplane.sdk", "jobplane.ops.backend", "jobplane.local", "click", "rich", "jsonschema",
         "moto", "numpy", "google.cloud.storage", "google.cloud.compute", "google.api_core", "functions_framework")
# Only some runs: a launch (its decision, the agent manifest, the VM script, prices), a queue drop, a notice
# (job views and costs), a notification topic, an update naming no field (difflib's hint).
SOME_RUNS = ("jobplane.decide.launch", "jobplane.boot.agent_bundle", "jobplane.boot.bootstrap", "jobplane.views.cost",
             "jobplane.model.prices", "jobplane.model.drops", "jobplane.views.jobview", "jobplane.clouds.sns",
             "difflib")
# pydantic and the records' models (a job's, its events and usage, an agent's, an owner's line): imported when a run
# reads or writes one of them, so a run that only lists (an idle backstop, a check of healthy jobs) never loads them.
# The sweeps' engine (a sweep's trials are specs) loads in a scheduled pass that finds a live sweep.
RECORD_MODELS = ("pydantic", "jobplane.model.jobrecord", "jobplane.model.spec", "jobplane.model.sweepspec",
                 "jobplane.model.history", "jobplane.model.usage", "jobplane.model.records", "jobplane.model.admission")
# Per function: the other functions' rules; the launcher in a reconciler (only a relaunch or a resume launches);
# records in the launcher (only a launch writes cluster.json).
NOT_AT_IMPORT = {
    "launcher": ("jobplane.control.reconcile", "jobplane.decide.model", "jobplane.decide.check",
                 "jobplane.decide.rerun", "jobplane.decide.uptime", "jobplane.decide.safety", "jobplane.model.metrics",
                 "jobplane.model.records"),
    "sweeper": ("jobplane.control.launcher", "jobplane.decide.rerun", "jobplane.sweeps.run"),
    "rerun": ("jobplane.control.launcher", "jobplane.decide.check", "jobplane.decide.uptime",
              "jobplane.model.metrics"),
    "uptime_cap": ("jobplane.control.launcher", "jobplane.decide.rerun"),
    # a job's credentials: no policy, no VM driven, no control run, no YAML, no record models (it reads a record's
    # facts: jobplane.model.jobfacts)
    "vend": ("jobplane.model.policy", "jobplane.clouds.aws", "jobplane.deployment", "jobplane.control",
             "jobplane.decide.model", "functions.aws.deployment", "yaml", "jobplane.model.yaml_input",
             *RECORD_MODELS),
}
LISTING_ONLY = CONTROL
# Every run needs these: they stay at import (Lambda's init), where deferring them would only move the cost. A
# control run reads the policy (YAML); a vend run reads the facts of the job's record (JSON).
EVERY_RUN = {name: ("yaml", "jobplane.model.policy", "jobplane.store.registry", "jobplane.clouds.aws",
                    "jobplane.clouds.s3") for name in CONTROL}
EVERY_RUN["vend"] = ("jobplane.model.jobfacts", "jobplane.store.registry", "jobplane.clouds.s3",
                     "jobplane.clouds.aws_vend")

PROBE = r"""
import json, sys
before = set(sys.modules)
import functions.aws.{name} as module
loaded = sorted(set(sys.modules) - before)
print(json.dumps({{"handler": callable(getattr(module, "handler", None)), "loaded": loaded}}))
"""


def loaded_by_import(name: str) -> set[str]:
    """The modules `import functions.aws.<name>` adds, in a fresh interpreter with the stack's environment."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")]),
           "JOBPLANE_BUCKET": "registry", "JOBPLANE_ROOT": "", "POWERTOOLS_SERVICE_NAME": "jobplane",
           "POWERTOOLS_METRICS_NAMESPACE": "jobplane", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(name=name)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.splitlines()[-1])
    assert probe["handler"], f"functions.aws.{name} has no handler()"
    return set(probe["loaded"])


def within(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    """The loaded modules that are one of names or inside one of them (a package's submodules)."""
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("name", HANDLERS)
def test_a_handler_imports_only_what_every_run_needs(name: str) -> None:
    loaded = loaded_by_import(name)
    assert within(loaded, NEVER) == []
    assert within(loaded, SOME_RUNS) == [], "import these where a run uses them (function-level imports)"
    assert within(loaded, NOT_AT_IMPORT[name]) == [], "no run of this function needs these at once"
    if name in LISTING_ONLY:
        assert within(loaded, RECORD_MODELS) == [], "the registry imports the record models when it reads one"
    assert [m for m in EVERY_RUN[name] if m not in loaded] == []


def test_reading_the_policy_loads_no_pydantic() -> None:
    """Every run of every function reads the policy; only some read a job's spec. The policy shares the spec's
    bounds (jobplane.model.bounds), not its module, and is checked by plain functions (jobplane.model.checked):
    reading it loads neither pydantic nor any of the spec's or a sweep's models."""
    probe = ("import json, sys; import jobplane.model.policy as p; p.parse_policy(b'max_nodes_per_job: 4'); "
             "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "shared")})
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert within(loaded, ("pydantic", "jobplane.model.spec", "jobplane.model.sweepspec", "jobplane.model.specfields",
                           "jobplane.model.jobrecord", "jobplane.model.history")) == []


BUILT = r"""
import json, sys, pydantic
import jobplane.model.spec, jobplane.sweeps.curves, jobplane.sweeps.record
print(json.dumps(sorted({f"{v.__module__}.{v.__qualname__}" for m in list(sys.modules.values())
                         if m and m.__name__.startswith("jobplane") for v in vars(m).values()
                         if isinstance(v, type) and issubclass(v, pydantic.BaseModel)
                         and v.__dict__.get("__pydantic_complete__")})))
"""


def test_importing_the_spec_builds_none_of_its_models() -> None:
    """A model's validator is built when a spec is first validated (defer_build), and the JSON schema of a field
    with two forms (jobplane.model.spec.OrModel) when a schema is asked for: importing the spec and a sweep's
    records builds none of their models."""
    proc = subprocess.run([sys.executable, "-c", BUILT], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "shared")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []
