"""The job spec: what a user drops into queue/ (YAML or JSON), validated with errors that name the field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    Tag,
    ValidationError,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from jobplane.model import accelerators, containers, images, specfields, sweepspec
from jobplane.model import secrets as secretspec
from jobplane.model.bounds import (
    MAX_BOOT_TIMEOUT,
    MAX_DEBUG_HOLD,
    MAX_RESTARTS,
    MAX_RETRIES,
    MAX_RUNTIME,
    MAX_SPOT_WAIT,
    MAX_STALL_TIMEOUT,
    MAX_STOP_GRACE,
    MAX_WAIT,
)
from jobplane.model.errors import FieldError, SpecError, from_validation_error
from jobplane.model.keys import JOB_ID_PATTERN, LABEL_KEY
from jobplane.model.specfields import AtMost, Duration, HpName, HpValue, MetricDefinition, StopOn, hp_variable
from jobplane.model.specfields import SpecModel as _Model
from jobplane.model.specfields import pattern_str as _pattern_str
from jobplane.model.sweepspec import (
    ARRAY_LABEL,
    MAX_JOB_ID,
    MAX_LABELS,
    MAX_PARAMETERS,
    MAX_TRIALS,
    TRIAL_LABELS,
    member_suffix,
    trial_suffix,
)

MAX_SCRIPT = 64 * 1024  # characters of `run` / `setup`: job.json and every event repeat the spec

def job_id_problem(job_id: str) -> str | None:
    """Why job_id is not a valid id, or None. Ids must be valid GCE names and labels and S3 key parts."""
    if re.match(JOB_ID_PATTERN, job_id):
        return None
    return (
        f"{job_id!r} is not a valid job id: 1-63 lowercase letters, digits or hyphens, "
        "starting with a letter and not ending with a hyphen"
    )


JobId = Annotated[
    str,
    _pattern_str(JOB_ID_PATTERN, "job id (1-63 lowercase letters, digits, hyphens; starts with a letter)"),
    Field(json_schema_extra={"pattern": JOB_ID_PATTERN}),
]
LABEL_VALUE = r"^[a-z0-9_-]{0,63}$"
LabelKey = Annotated[
    str, _pattern_str(LABEL_KEY, "label key (lowercase letter, then up to 62 of a-z 0-9 _ -)"),
    Field(json_schema_extra={"pattern": LABEL_KEY}),
]
LabelValue = Annotated[
    str, _pattern_str(LABEL_VALUE, "label value (up to 63 of a-z 0-9 _ -)"),
    Field(json_schema_extra={"pattern": LABEL_VALUE}),
]
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[
    str, _pattern_str(ENV_NAME, "environment variable name (letters, digits, _; not starting with a digit)"),
    Field(json_schema_extra={"pattern": ENV_NAME}),
]
INSTANCE_TYPE = r"^[a-z0-9][a-z0-9.-]{0,63}$"
InstanceType = Annotated[
    str, _pattern_str(INSTANCE_TYPE, "instance type (e.g. g5.xlarge, a2-highgpu-1g)"),
    Field(json_schema_extra={"pattern": INSTANCE_TYPE}),
]
ZONE = r"^[a-z0-9-]{2,63}$"
Zone = Annotated[str, _pattern_str(ZONE, "zone (e.g. us-east-1a, us-central1-a)")]
CHANNEL = r"^[a-z0-9][a-z0-9_-]{0,62}$"
Channel = Annotated[
    str, _pattern_str(CHANNEL, "input name (lowercase letters, digits, _ or -; becomes SM_CHANNEL_<NAME>)"),
    Field(json_schema_extra={"pattern": CHANNEL}),
]


def _env_value(value: object) -> object:
    # YAML turns `LR: 0.1` into a float; users mean the string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


EnvValue = Annotated[str, BeforeValidator(_env_value)]


def _abs_path(value: object) -> object:
    if isinstance(value, str) and (not value.startswith("/") or ".." in value.split("/")):
        raise ValueError(f"{value!r} must be an absolute path without '..'")
    return value


AbsPath = Annotated[str, BeforeValidator(_abs_path)]

Cloud = Literal["aws", "gcp"]
URI_SCHEMES: dict[str, str] = {"aws": "s3://", "gcp": "gs://"}


class InputChannel(_Model):
    """A data channel, mounted at <input root>/data/<name> like SageMaker's channels."""

    uri: str = Field(description="s3:// (aws) or gs:// (gcp) prefix or object")
    distribution: Literal["replicated", "sharded"] = Field(
        "replicated", description="replicated: every node gets all of it; sharded: keys split across nodes"
    )


MAX_EXIT_CODES = 32
ExitCode = Annotated[int, Field(ge=1, le=255)]


class Retry(_Model):
    """Reruns of attempts that end in an error, counted apart from max_restarts (preemptions, failed boots).
    Never on a stop_on match, a cancel, the uptime cap or a stop request."""

    max: int = Field(0, ge=0, le=MAX_RETRIES, description="retries of the job at most; 0: off")
    on_exit_codes: list[ExitCode] = Field(
        default_factory=list, max_length=MAX_EXIT_CODES,
        description="retry when a rank exits with one of these codes (1 to 255)")
    on_lost: bool = Field(False, description="retry when a VM of a job without `spot` vanishes without an exit "
                                             "report (a Spot job's is a preemption)")
    on_stalled: bool = Field(False, description="retry when the attempt stalls (stall_timeout)")


def _gpu_name(value: str) -> str:
    if accelerators.model_of(value) is None:
        raise ValueError(f"unknown GPU {value!r}: use one of {accelerators.known()} (any case), or a Compute Engine "
                         "accelerator type (e.g. nvidia-tesla-t4)")
    return value


@dataclass(frozen=True, eq=False)  # hashed by identity: its schema is a dict
class OrModel:
    """A field's JSON schema: its other form (`short`) or the model's own schema, written out in place. The model's
    schema is made when a schema is asked for (`jobplane schema`), not at import, which would build its validator in
    every handler's cold start."""

    short: JsonSchemaValue
    model: type[BaseModel]

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [self.short, self.model.model_json_schema()]}


class Accelerators(_Model):
    """GPUs per node. GCE: attached to an N1 type (T4, V100, P100, P4), or the GPUs an a2/a3/g2 type comes with;
    EC2: the GPUs the instance type comes with (checked, never added)."""

    type: Annotated[str, AfterValidator(_gpu_name)] = Field(
        description=f"GPU: {', '.join(accelerators.GPUS)} (any case) or a GCE accelerator type (nvidia-tesla-t4)")
    count: int = Field(1, ge=1, le=16, description="GPUs per node")

    @property
    def model(self) -> str | None:
        return accelerators.model_of(self.type)


AcceleratorsField = Annotated[
    Accelerators,
    BeforeValidator(accelerators.parse_short),
    OrModel({"type": "string", "pattern": accelerators.SHORT_FORM.pattern,
             "description": "TYPE or TYPE:COUNT, e.g. T4:1"}, Accelerators),
]


class SpotOptions(_Model):
    """Spot with a way out: after `after` of Spot refused in every zone and type, the attempt runs on-demand."""

    fallback: Literal["on_demand"] = Field(description="on_demand (the one choice): launch the attempt on-demand "
                                                       "once Spot has been refused for `after`")
    after: Annotated[Duration, AtMost(MAX_SPOT_WAIT)] = Field(
        30 * 60, description="how long an attempt waits for Spot, counted from its first refusal (every zone and type "
                             "refused)")


def _spot_form(value: object) -> str:
    # one member per form, so a bad mapping reports only its own fields (not "should be a valid boolean" too)
    return "dict" if isinstance(value, dict | SpotOptions) else "bool"


def _image_reference(value: str) -> str:
    if problem := containers.reference_problem(value):
        raise ValueError(problem)
    return value


def _run_option(value: str) -> str:
    if problem := containers.option_problem(value):
        raise ValueError(problem)
    return value


class Container(_Model):
    """The image setup and run execute in, on the VM: its network and GPUs, the job's directories mounted at
    their own paths, the job's variables passed. Pulled with the VM's identity (ECR, Artifact Registry) or
    anonymously, or with `registry_auth`: the name of a secret of the owner holding user:token (never its value)."""

    image: Annotated[str, AfterValidator(_image_reference)] = Field(
        min_length=1, description="[REGISTRY/]NAME[:TAG][@sha256:DIGEST], e.g. pytorch/pytorch:2.4.0-cuda12.4-"
                                  "cudnn9-runtime or ACCOUNT.dkr.ecr.REGION.amazonaws.com/train:v3")
    args: list[Annotated[str, AfterValidator(_run_option)]] = Field(
        default_factory=list, max_length=containers.MAX_OPTIONS,
        description="extra options for the runtime's run (e.g. --shm-size=16g, --ipc=host); not those jobplane "
                    "sets (--name, --network, --rm, --entrypoint, --workdir...)")
    registry_auth: specfields.SecretName | None = Field(
        None, description="a secret of the job's owner holding user:token, to pull from a private registry")


def _container_form(value: object) -> object:
    return {"image": value} if isinstance(value, str) else value


ContainerField = Annotated[
    Container,
    BeforeValidator(_container_form),
    OrModel({"type": "string",
             "description": "the image alone: container: pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"}, Container),
]


class TensorBoard(_Model):
    """Where the job writes TensorBoard event files (and profiler traces): the agent uploads them as they grow."""

    log_dir: AbsPath = Field(description="the directory the job's SummaryWriter writes to, e.g. "
                                         "/opt/ml/output/tensorboard (SageMaker's)")


MIN_SYSTEM_METRICS_INTERVAL, MAX_SYSTEM_METRICS_INTERVAL = 5, 3600


def _system_interval(value: int) -> int:
    if 0 < value < MIN_SYSTEM_METRICS_INTERVAL:
        raise ValueError(f"must be 0 (off) or at least {MIN_SYSTEM_METRICS_INTERVAL} s, got {value}")
    return value


class JobSpec(_Model):
    """One training job. Unknown fields are errors."""

    id: JobId | None = Field(None, description="job id; defaults to the queue file's name")
    name: str | None = Field(None, min_length=1, max_length=128, description="human-readable name")
    cloud: Cloud = "aws"
    region: Annotated[str, _pattern_str(r"^[a-z0-9-]{2,32}$", "region (e.g. us-east-1)")] | None = None
    zones: list[Zone] = Field(default_factory=list, description="zones to try, in order")
    instance_type: InstanceType | list[InstanceType] = Field(
        ..., description="instance type, or a list tried in order when capacity runs out"
    )
    image: str | None = Field(
        None, min_length=1, max_length=512,
        description=f"image alias ({', '.join(images.ALIASES)}), AMI id or resolve:ssm:<parameter> (aws), GCE image "
                    "path (gcp); default: the policy's CPU or GPU image for the instance type (GPU with "
                    "`accelerators`)")
    container: ContainerField | None = Field(
        None, description="run setup and run in this container image (podman or docker on the VM image); "
                          "{image, args} or the image alone")
    num_nodes: int = Field(1, ge=1, le=1024, description="nodes launched together, all or nothing")
    accelerators: AcceleratorsField | None = Field(
        None, description="GPUs per node: {type, count} or TYPE:COUNT (T4:1); picks the policy's GPU image")
    spot: Annotated[Annotated[bool, Tag("bool")] | Annotated[SpotOptions, Tag("dict")],
                    Discriminator(_spot_form),
                    OrModel({"type": "boolean"}, SpotOptions)] = Field(
        False, description="Spot VMs: a preempted attempt reruns from the newest checkpoint, up to `max_restarts` "
                           "times; {fallback: on_demand, after: 20m} launches on-demand once Spot is refused that long")
    max_restarts: int = Field(3, ge=0, le=MAX_RESTARTS, description="reruns after preemption or a failed boot")
    retry: Retry | None = Field(None, description="retry attempts that end in these errors, from the newest "
                                                  "checkpoint")
    max_runtime: Annotated[Duration, AtMost(MAX_RUNTIME)] | None = Field(
        None, description="uptime cap per attempt; policy default if unset, never over its max_runtime_ceiling")
    max_wait: Annotated[Duration, AtMost(MAX_WAIT)] | None = Field(
        None, description="total time to finish, counted from submission, including capacity waits and reruns: no "
                          "attempt starts after it; policy default if unset, never over its max_wait_ceiling")
    max_cost: float | None = Field(
        None, gt=0, le=1e6, description="USD the job may cost in all (instance time x price, every attempt): at it "
                                        "the job is asked to stop, checkpoints and ends FAILED naming max_cost; policy "
                                        "default if unset, never over its max_cost_ceiling")
    max_price: float | None = Field(
        None, gt=0, le=1e6, description="USD an instance-hour at most: an instance type or market priced above it "
                                        "is refused, naming max_price")
    stall_timeout: Annotated[Duration, AtMost(MAX_STALL_TIMEOUT)] | None = Field(
        None, description="no heartbeat or no new output for this long")
    boot_timeout: Annotated[Duration, AtMost(MAX_BOOT_TIMEOUT)] | None = Field(
        None, description="first heartbeat must arrive within this")
    stop_grace: Annotated[Duration, AtMost(MAX_STOP_GRACE)] = Field(
        60, description="SIGTERM to SIGKILL grace on stop or preemption")
    debug_hold: Annotated[Duration, AtMost(MAX_DEBUG_HOLD)] | None = Field(
        None, description="keep a FAILED attempt's VMs this long for `jobplane ssh`; the sweeper's check terminates "
                          "them at the end, and the held time is costed; not in a sweep")
    code: str | None = Field(None, description="s3:// or gs:// URI of a code tarball or prefix")
    setup: str | None = Field(None, max_length=MAX_SCRIPT, description="shell run once before `run` (at most 64 KiB)")
    run: str = Field(..., min_length=1, max_length=MAX_SCRIPT,
                     description="shell command that trains (at most 64 KiB: put longer code in --code)")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    secrets: dict[EnvName, specfields.SecretField] = Field(
        default_factory=dict, max_length=secretspec.MAX_PER_JOB,
        description="environment variable -> a secret of the job's owner (`jobplane secret set`), or {name, file: "
                    "true} for a 0400 file on a tmpfs whose path the variable holds; job.json keeps the names only")
    hyperparameters: dict[HpName, HpValue] = Field(
        default_factory=dict, max_length=100,
        description="written to /opt/ml/input/config/hyperparameters.json and set as SM_HPS and SM_HP_<NAME>, as "
                    "SageMaker does; `jobplane submit --hp name=value` overrides one")
    metrics: list[MetricDefinition] | None = Field(
        None, max_length=40,
        description="metrics read from the output (SageMaker's MetricDefinitions); unset: loss, accuracy, "
                    "learning_rate and step")
    stop_on: StopOn | None = Field(None, description="stop the job early (FAILED, no rerun) on these")
    inputs: dict[Channel, InputChannel] = Field(default_factory=dict)
    checkpoint_dir: AbsPath = "/opt/ml/checkpoints"
    artifacts_dir: AbsPath = "/opt/ml/model"
    tensorboard: TensorBoard | None = Field(
        None, description="TensorBoard event files to upload to teams/<owner>/<id>/tensorboard/ as they grow "
                          "(`jobplane tensorboard ID` serves them)")
    system_metrics_interval: Annotated[int, AfterValidator(_system_interval)] = Field(
        15, ge=0, le=MAX_SYSTEM_METRICS_INTERVAL,
        description="seconds between the agent's samples of CPU, memory, disk, network and GPUs "
                    f"(`jobplane metrics ID --system`); 0: off, else at least {MIN_SYSTEM_METRICS_INTERVAL}")
    disk_gb: int = Field(100, ge=8, le=16384)
    master_port: int = Field(29500, ge=1024, le=65535)
    owner: Annotated[str, _pattern_str(LABEL_KEY, "owner (lowercase letter, then a-z 0-9 _ -, at most 63)")] = (
        "default"
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    after: list[specfields.AfterEntry] = Field(default_factory=list, max_length=20, description="jobs or arrays "
        "to wait for: ID (afterok: SUCCEEDED; an array COMPLETED), afterany:ID (ended), afternotok:ID (ended otherwise)"
        "; one never met ends this job FAILED; each submitted before it")
    priority: Annotated[str, _pattern_str(LABEL_KEY, "priority class (lowercase letter, then up to 62 of a-z 0-9 _ -)")
                        ] | None = Field(None, description="a priority class of the policy's priority_classes: "
                                                           "within the owner's quota a higher class goes first; "
                                                           "unset: priority 0")
    sweep: sweepspec.SweepSpec | None = Field(
        None, description="a hyperparameter search: the rest of the spec is every trial's template")
    array: sweepspec.ArraySpec | None = Field(
        None, description="an array job: `size` jobs of the rest of the spec, <id>-0 to <id>-(size-1), each told its "
                          "index (JOBPLANE_ARRAY_INDEX); not with sweep or debug_hold")

    @property
    def secret_names(self) -> tuple[str, ...]:
        """The owner's secrets the job reads (`secrets:` and `container.registry_auth`), each once."""
        return secretspec.unique(name for _, name in secretspec.named(self))

    @property
    def fan_out(self) -> sweepspec.SweepSpec | sweepspec.ArraySpec | None:
        """The section that makes this spec many jobs rather than one: its sweep, or its array (an array's member
        is one job: its array section has its index)."""
        if self.sweep is not None:
            return self.sweep
        return self.array if self.array is not None and self.array.index is None else None

    @property
    def belongs_to(self) -> tuple[str, str] | None:
        """The sweep or array this job is one of, by the label each sets on its jobs: ("sweep" or "array", its
        id); None for a job of its own."""
        if self.array is not None and (array := self.labels.get(ARRAY_LABEL)):
            return "array", array
        return ("sweep", sweep) if (sweep := self.labels.get(TRIAL_LABELS[0])) else None

    @property
    def instance_types(self) -> list[str]:
        return [self.instance_type] if isinstance(self.instance_type, str) else list(self.instance_type)

    @property
    def attempts(self) -> int:
        """The attempts this spec allows at most: the first, max_restarts reruns and retry.max retries (the
        policy's max_attempts_per_job may allow fewer)."""
        return 1 + self.max_restarts + (self.retry.max if self.retry is not None else 0)

    @property
    def uses_spot(self) -> bool:
        """Attempts ask for Spot first (`spot: true` or the mapping)."""
        return self.spot is not False

    @property
    def spot_fallback_after(self) -> int | None:
        """Seconds of Spot refusals after which an attempt launches on-demand; None: it waits for Spot."""
        return self.spot.after if isinstance(self.spot, SpotOptions) else None


_ALLOWED = {
    "": list(JobSpec.model_fields),
    "inputs.*": list(InputChannel.model_fields),
    "metrics[*]": list(MetricDefinition.model_fields),
    "stop_on": list(StopOn.model_fields),
    "retry": list(Retry.model_fields),
    "accelerators": list(Accelerators.model_fields),
    "spot": list(SpotOptions.model_fields),
    "container": list(Container.model_fields),
    "tensorboard": list(TensorBoard.model_fields),
    **sweepspec.ALLOWED,
}


def known_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored spec (in job.json) without the fields this version does not know, at every level: a record
    written by a newer version during a rolling deploy stays readable. New specs stay strict (parse_spec)."""
    out = {k: v for k, v in raw.items() if k in _ALLOWED[""]}
    if isinstance(out.get("inputs"), dict):
        out["inputs"] = {name: {k: v for k, v in ch.items() if k in _ALLOWED["inputs.*"]} if isinstance(ch, dict)
                         else ch for name, ch in out["inputs"].items()}
    if isinstance(out.get("metrics"), list):
        out["metrics"] = [{k: v for k, v in m.items() if k in _ALLOWED["metrics[*]"]} if isinstance(m, dict) else m
                          for m in out["metrics"]]
    if isinstance(out.get("stop_on"), dict):
        out["stop_on"] = {k: v for k, v in out["stop_on"].items() if k in _ALLOWED["stop_on"]}
    for name in ("accelerators", "spot", "container", "tensorboard"):
        if isinstance(out.get(name), dict):
            out[name] = {k: v for k, v in out[name].items() if k in _ALLOWED[name]}
    if isinstance(out.get("retry"), dict):
        out["retry"] = {k: v for k, v in out["retry"].items() if k in _ALLOWED["retry"]}
    if "sweep" in out:
        out["sweep"] = sweepspec.known_fields(out["sweep"])
    if isinstance(out.get("array"), dict):
        out["array"] = {k: v for k, v in out["array"].items() if k in _ALLOWED["array"]}
    return out


def _retry_checks(raw: dict[str, Any]) -> list[FieldError]:
    """A code listed twice; retries asked for on nothing (a max with no trigger is surely a mistake)."""
    retry = raw.get("retry")
    if not isinstance(retry, dict):
        return []
    errors: list[FieldError] = []
    codes = retry.get("on_exit_codes")
    seen: dict[object, int] = {}
    for i, code in enumerate(codes if isinstance(codes, list) else []):
        if isinstance(code, int) and not isinstance(code, bool) and (first := seen.setdefault(code, i)) != i:
            errors.append(FieldError(f"retry.on_exit_codes[{i}]", f"{code} is listed twice (also [{first}])"))
    top = retry.get("max")
    if isinstance(top, int) and not isinstance(top, bool) and top > 0 and not codes \
            and retry.get("on_lost") is not True and retry.get("on_stalled") is not True:
        errors.append(FieldError("retry.max", "retries on nothing: give on_exit_codes, on_lost: true or "
                                              "on_stalled: true"))
    return errors


def _cross_checks(raw: dict[str, Any]) -> list[FieldError]:
    """Rules spanning fields, run on the raw document so they report even when other fields fail."""
    errors: list[FieldError] = []
    cloud = raw.get("cloud", "aws")
    scheme = URI_SCHEMES.get(cloud) if isinstance(cloud, str) else None
    if scheme is None:
        return errors  # the cloud field itself reports
    uris: list[tuple[str, object]] = [("code", raw.get("code"))]
    inputs = raw.get("inputs")
    if isinstance(inputs, dict):
        uris += [(f"inputs.{name}.uri", ch.get("uri")) for name, ch in inputs.items() if isinstance(ch, dict)]
    for path, uri in uris:
        if not isinstance(uri, str) or not uri:
            continue
        if "://" not in uri and path == "code":
            errors.append(FieldError(path, f"{uri!r} is a local path: submit it with `jobplane submit --code DIR`, "
                                           f"or give a {scheme} URI"))
        elif not uri.startswith(scheme) or len(uri) <= len(scheme):
            errors.append(FieldError(path, f"{uri!r} must be a {scheme} URI for cloud {cloud!r}"))
    image = raw.get("image")
    if isinstance(image, str) and image.strip().startswith(containers.DOCKER_SCHEME):
        errors.append(FieldError("image", f"{image.strip()!r} is a container image: give it as `container: "
                                          f"{{image: {containers.normalize(image.strip())}}}` (`image:` is the VM's)"))
    elif isinstance(image, str) and image.strip() and (problem := images.image_problem(cloud, image.strip())):
        errors.append(FieldError("image", problem))
    instance_type = raw.get("instance_type")
    if isinstance(instance_type, list) and not instance_type:
        errors.append(FieldError("instance_type", "the list is empty: give at least one instance type"))
    if raw.get("accelerators") is not None and isinstance(instance_type, str | list):
        types = [instance_type] if isinstance(instance_type, str) else [t for t in instance_type if isinstance(t, str)]
        errors += [FieldError(path, message) for path, message in accelerators.check(cloud, raw["accelerators"], types)]
    if isinstance(raw.get("labels"), dict):  # ownership is ours: a label must not pose as it (quotas count it)
        errors += [FieldError(f"labels.{k}", "the jobplane- prefix is reserved for the labels jobplane sets")
                   for k in raw["labels"] if isinstance(k, str) and k.lower().startswith("jobplane")]
    if isinstance(raw.get("env"), dict):
        errors += [
            FieldError(f"env.{k}", "names starting with JOBPLANE_ are reserved")
            for k in raw["env"]
            if isinstance(k, str) and k.upper().startswith("JOBPLANE_")
        ]
    return errors + secretspec.spec_problems(raw)


def _clashes(raw: dict[str, Any]) -> list[FieldError]:
    """Two metrics with one name; two hyperparameters with one SM_HP_ variable ("lr" and "LR")."""
    errors: list[FieldError] = []
    metrics, hps = raw.get("metrics"), raw.get("hyperparameters")
    names: dict[str, int] = {}
    for i, metric in enumerate(metrics if isinstance(metrics, list) else []):
        name = metric.get("name") if isinstance(metric, dict) else None
        if isinstance(name, str) and (first := names.setdefault(name.strip(), i)) != i:
            errors.append(FieldError(f"metrics[{i}].name", f"{name!r} is defined twice (also metrics[{first}])"))
    variables: dict[str, str] = {}
    for key in hps if isinstance(hps, dict) else {}:
        if isinstance(key, str) and (first_key := variables.setdefault(hp_variable(key), key)) != key:
            errors.append(FieldError(f"hyperparameters.{key}", f"becomes SM_HP_{key.upper()}, as {first_key!r} does"))
    return errors


def parse_spec(text: str | bytes, job_id: str | None = None, source: str = "spec") -> JobSpec:
    """Validate a spec document. job_id is the queue file's stem, when there is one."""
    from jobplane.model import yaml_input  # PyYAML, for specs read as text: the vend function reads only records

    raw = yaml_input.load_document(text, source)
    errors = _cross_checks(raw) + _clashes(raw) + _retry_checks(raw)
    if job_id is not None:
        problem = job_id_problem(job_id)
        if problem:
            errors.append(FieldError("id", f"{problem} (from the file name)"))
        elif raw.get("id") not in (None, job_id):
            errors.append(FieldError("id", f"{raw['id']!r} differs from the file name's id {job_id!r}"))
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        errors = from_validation_error(exc, _ALLOWED) + errors
        raise SpecError(errors) from None
    errors += _sweep_problems(spec, job_id) + _array_problems(spec, job_id)
    if errors:
        raise SpecError(errors)
    if job_id is not None and spec.id is None:
        spec = spec.model_copy(update={"id": job_id})
    return spec


def _sweep_problems(spec: JobSpec, job_id: str | None) -> list[FieldError]:
    """What a valid spec's sweep section gets wrong with itself and with the rest of the spec (the template of every
    trial): each names the field."""
    from jobplane.model.metrics import DEFAULT_METRICS, STEP  # only a sweep's spec needs the default metrics

    sweep = spec.sweep
    if sweep is None:
        return []
    errors: list[FieldError] = []
    grid_size = sweep.grid_size
    if sweep.strategy == "grid":
        errors += [FieldError(f"sweep.parameters.{name}", f"a grid needs a finite set: give {d.kind} steps: N (N "
                                                          "values from lo to hi), or use int or choice")
                   for name, d in sweep.parameters.items() if d.size is None]
        if grid_size is not None and sweep.max_trials is not None and sweep.max_trials > grid_size:
            errors.append(FieldError("sweep.max_trials", f"{sweep.max_trials} exceeds the grid's {grid_size} "
                                                         "combinations"))
        elif grid_size is not None and sweep.max_trials is None and grid_size > MAX_TRIALS:
            errors.append(FieldError("sweep.max_trials", f"the grid has {grid_size} combinations, more than "
                                                         f"{MAX_TRIALS} trials: set max_trials to run its first ones"))
    elif sweep.max_trials is None:
        errors.append(FieldError("sweep.max_trials", f"required with strategy {sweep.strategy} (only a grid's "
                                                     "default is its size)"))
    if sweep.trial_count and sweep.max_parallel > sweep.trial_count:
        errors.append(FieldError("sweep.max_parallel", f"{sweep.max_parallel} exceeds the {sweep.trial_count} "
                                                       "trials of the sweep"))
    metric_names = [m.name for m in (DEFAULT_METRICS if spec.metrics is None else spec.metrics) if m.name != STEP]
    if sweep.objective.metric not in metric_names:
        errors.append(FieldError("sweep.objective.metric", f"{sweep.objective.metric!r} is not a metric the spec "
                                                           f"reads (it reads: {', '.join(metric_names) or 'none'}); "
                                                           "define it in metrics:"))
    if sweep.early_stop is not None and sweep.early_stop.rule == "asha" and sweep.early_stop.after_step < 1:
        errors.append(FieldError("sweep.early_stop.after_step", "asha's first rung: at least 1"))
    fixed = {hp_variable(name): name for name in spec.hyperparameters}
    swept: dict[str, str] = {}
    for name in sweep.parameters:
        variable = hp_variable(name)
        if name in spec.hyperparameters:
            errors.append(FieldError(f"sweep.parameters.{name}", "also set in hyperparameters: a swept parameter "
                                                                 "takes its value from the sweep"))
        elif (other := fixed.get(variable) or swept.setdefault(variable, name)) != name:
            where = "hyperparameters" if variable in fixed else "sweep.parameters"
            errors.append(FieldError(f"sweep.parameters.{name}", f"becomes {variable}, as {other!r} in {where} does"))
    if spec.debug_hold is not None:  # a held FAILED trial has ended for the sweep, but its VMs run on for up to a day
        errors.append(FieldError("debug_hold", "not in a sweep: a failed trial's held VMs would run beside the next "
                                               "trials, past sweep.max_parallel; submit the failed trial's parameters "
                                               "as a job with debug_hold to look at it"))
    if len(spec.hyperparameters) + len(sweep.parameters) > MAX_PARAMETERS:
        errors.append(FieldError("sweep.parameters", f"{len(sweep.parameters)} swept and {len(spec.hyperparameters)} "
                                                     f"fixed hyperparameters: a trial takes at most {MAX_PARAMETERS}"))
    errors += [FieldError(f"labels.{k}", "set on every trial by the sweep") for k in TRIAL_LABELS if k in spec.labels]
    if len(spec.labels) + len(TRIAL_LABELS) > MAX_LABELS:
        errors.append(FieldError("labels", f"a trial adds {len(TRIAL_LABELS)} labels ({', '.join(TRIAL_LABELS)}): "
                                           f"at most {MAX_LABELS - len(TRIAL_LABELS)} here"))
    sweep_id = spec.id or job_id
    longest = trial_suffix(max(sweep.trial_count, 1))
    if sweep_id is not None and len(sweep_id) + len(longest) > MAX_JOB_ID:
        errors.append(FieldError("id", f"{sweep_id!r} is too long for a sweep: its trials are {sweep_id}{longest}..., "
                                       f"at most {MAX_JOB_ID} characters; use at most {MAX_JOB_ID - len(longest)}"))
    return errors


def _array_problems(spec: JobSpec, job_id: str | None) -> list[FieldError]:
    """What a valid spec's array section gets wrong with the rest of the spec (every member's template), each naming
    the field; and a member's index that is not its own."""
    array = spec.array
    if array is None:
        return []
    errors: list[FieldError] = []
    array_id = spec.id or job_id
    if spec.sweep is not None:
        errors.append(FieldError("array", "not with sweep: a sweep's trials differ by their parameters, an array's "
                                          "members by their index; submit one or the other"))
    if array.index is not None:  # a member's spec, as the array's reconcile drops it: <array>-<index>, labelled
        parent = spec.labels.get(ARRAY_LABEL)
        if array.index >= array.size:
            errors.append(FieldError("array.index", f"{array.index} is outside the array's 0 to {array.size - 1}"))
        elif parent is None or array_id not in (None, parent + member_suffix(array.index)):
            errors.append(FieldError("array.index", "set by jobplane on each member of an array (job <array>-<index>, "
                                                    f"label {ARRAY_LABEL}: <array>): leave it out"))
        return errors
    if array.max_parallel is not None and array.max_parallel > array.size:
        errors.append(FieldError("array.max_parallel", f"{array.max_parallel} exceeds the array's {array.size} "
                                                       "members"))
    if spec.debug_hold is not None:  # a held FAILED member has ended for the array, but its VMs run on for a day
        errors.append(FieldError("debug_hold", "not in an array: a failed member's held VMs would run beside the next "
                                               "members, past array.max_parallel; submit the failed member's spec as "
                                               "a job with debug_hold to look at it"))
    if ARRAY_LABEL in spec.labels:
        errors.append(FieldError(f"labels.{ARRAY_LABEL}", "set on every member by the array"))
    elif len(spec.labels) + 1 > MAX_LABELS:
        errors.append(FieldError("labels", f"a member adds the label {ARRAY_LABEL}: at most {MAX_LABELS - 1} here"))
    longest = member_suffix(array.size - 1)
    if array_id is not None and len(array_id) + len(longest) > MAX_JOB_ID:
        errors.append(FieldError("id", f"{array_id!r} is too long for an array: its members are {array_id}{longest}"
                                       f"..., at most {MAX_JOB_ID} characters; use at most "
                                       f"{MAX_JOB_ID - len(longest)}"))
    return errors


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_none=True)


def json_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://jobplane.dev/schema/jobspec.schema.json"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
