"""Platform policy (`config/policy.yaml` in the bucket): caps, quotas, defaults and where VMs go."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, ClassVar

from jobplane.model import accelerators, images
from jobplane.model.bounds import (
    DAY,
    MAX_ATTEMPTS,
    MAX_BOOT_TIMEOUT,
    MAX_RUNTIME,
    MAX_STALL_TIMEOUT,
    MAX_WAIT,
    format_duration,
)
from jobplane.model.checked import (
    build,
    checked,
    duration,
    flag,
    items,
    mapping,
    nested,
    number,
    one_of,
    optional,
    text,
    whole,
)
from jobplane.model.errors import FieldError
from jobplane.model.keys import LABEL_KEY  # an owner's or a priority class's name, as a spec names them
from jobplane.model.yaml_input import load_document

if TYPE_CHECKING:
    from jobplane.model.spec import JobSpec  # annotations only: reading the policy builds no spec model

MAX_JOB_USD = 1e6  # a job's max_cost, and an instance-hour's max_price, at most
GRACE = duration(DAY)  # the safety graces and the idle-GPU window: a day at most
INSTANCE_TYPE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NAME = text(2048)  # ids, names and ARNs (an IAM ARN is at most 2,048 characters)
NAMES = items(NAME, 100)


def _image(cloud: str) -> Any:
    def check(value: Any, path: str) -> str:
        image: str = NAME(value, path)
        if problem := images.image_problem(cloud, image):
            raise ValueError(problem)
        return image
    return optional(check)


class _Images:
    """The default images of one cloud: an alias or a raw image, for CPU and for GPU instance types (unset:
    images.DEFAULT_CPU; for GPUs default_image if set, else images.DEFAULT_GPU)."""

    cloud: ClassVar[str]
    default_image: str | None
    default_gpu_image: str | None

    def default_for(self, instance_type: str, gpu: bool = False) -> str:
        """The default image for this instance type, or for GPUs attached to it (gpu: the spec's
        `accelerators`); an older policy's lone default_image serves both."""
        if not (gpu or images.has_gpu(self.cloud, instance_type)):
            return self.default_image or images.DEFAULT_CPU
        return self.default_gpu_image or self.default_image or images.DEFAULT_GPU


@dataclass(frozen=True)
class AwsPlacement(_Images):
    """Where and as whom EC2 instances run (created by the CDK stack), and from which images."""

    cloud: ClassVar[str] = "aws"
    default_image: str | None = checked(_image("aws"), None)
    default_gpu_image: str | None = checked(_image("aws"), None)
    instance_profile: str | None = checked(optional(NAME), None)  # instance profile name or ARN for the VMs
    subnets: list[str] = checked(NAMES, factory=list)  # subnet ids, tried in order
    security_groups: list[str] = checked(NAMES, factory=list)
    # ask for a public IPv4 address per VM (egress through an internet gateway); None: the subnet's own setting
    public_ip: bool | None = checked(optional(flag), None)
    placement_group: str | None = checked(optional(NAME), None)  # cluster placement group for multi-node jobs
    key_name: str | None = checked(optional(NAME), None)


@dataclass(frozen=True)
class GcpPlacement(_Images):
    cloud: ClassVar[str] = "gcp"
    default_image: str | None = checked(_image("gcp"), None)
    default_gpu_image: str | None = checked(_image("gcp"), None)
    project: str | None = checked(optional(NAME), None)
    service_account: str | None = checked(optional(NAME), None)  # service account e-mail for the VMs
    network: str | None = checked(optional(NAME), None)
    subnetwork: str | None = checked(optional(NAME), None)


@dataclass(frozen=True)
class SafetyPolicy:
    """Limits on what the reconcilers may terminate in one run."""

    dry_run: bool = checked(flag, False)  # decide and log, apply nothing
    max_terminations_per_run: int = checked(whole(0, 100_000), 20)
    max_terminations_percent: int = checked(whole(0, 100), 50)  # of managed instances, per run
    orphan_grace: int = checked(GRACE, 600)  # never terminate an orphan younger than this
    stop_grace: int = checked(GRACE, 600)  # stop request this long before the uptime cap


@dataclass(frozen=True)
class IdleGpuPolicy:
    """A RUNNING job whose GPUs sit idle: every rank's mean GPU utilization over `window` under `threshold`."""

    window: int = checked(GRACE, 30 * 60)  # the agent averages each rank's GPU utilization over this
    threshold: float = checked(number(0, 100), 5.0)  # percent: a mean under it is idle
    # warn: an event, a metric and a notification, once per attempt; stop: that, then a graceful stop (the job ends
    # STALLED, the reason says idle GPU); off: not watched
    action: str = checked(one_of("warn", "stop", "off"), "warn")


@dataclass(frozen=True)
class AccessPolicy:
    """How people reach a running job's VMs. Who may is the platform team's IAM decision (docs/operations.md)."""

    # `jobplane ssh`: a shell in a job's VM (AWS: SSM Session Manager, GCP: IAP TCP forwarding; the deployment must
    # allow it too)
    ssh: bool = checked(flag, False)


@dataclass(frozen=True)
class PriorityClass:
    """A priority a spec may name (`priority:`): its number (higher goes first within an owner's quota), and which
    owners may use it (unset: all)."""

    value: int = checked(whole(-1_000_000, 1_000_000))
    owners: list[str] | None = checked(optional(items(text(63), 1000)), None)


@dataclass(frozen=True)
class BudgetPolicy:
    """Dollars each owner may spend a calendar month (UTC), by jobplane's estimate of instance time (as `jobplane
    cost` estimates it)."""

    # owner -> USD a month; an owner not named has no budget
    monthly_usd: dict[str, float] = checked(mapping(LABEL_KEY, number(0, 1e9, above=True), 1000), factory=dict)
    # a notification, once an owner a month, when its spend reaches this percent of its budget
    warn_at_percent: int = checked(whole(1, 100), 80)
    # a new job of an owner at or past its budget: refuse (it ends FAILED with the figures) or wait in its owner's
    # line until the next month (or its max_wait)
    on_exceeded: str = checked(one_of("refuse", "wait"), "refuse")
    # owner -> refuse or wait: an owner's own on_exceeded, over the deployment-wide one
    on_exceeded_by_owner: dict[str, str] = checked(mapping(LABEL_KEY, one_of("refuse", "wait"), 1000), factory=dict)

    def limit(self, owner: str) -> float | None:
        return self.monthly_usd.get(owner)

    def on_exceeded_for(self, owner: str) -> str:
        """What happens to a new job of this owner at its budget: refuse or wait."""
        return self.on_exceeded_by_owner.get(owner, self.on_exceeded)


@dataclass(frozen=True)
class Policy:
    allowed_instance_types: list[str] = checked(items(text(128), 1000), factory=lambda: ["*"])  # glob patterns
    max_nodes_per_job: int = checked(whole(1, 100_000), 16)
    default_max_runtime: int = checked(duration(MAX_RUNTIME), 24 * 3600)
    max_runtime_ceiling: int = checked(duration(MAX_RUNTIME), 7 * DAY)
    default_max_wait: int = checked(duration(MAX_WAIT), 2 * DAY)
    # a spec's max_wait above it is refused; no attempt of a job starts after it
    max_wait_ceiling: int = checked(duration(MAX_WAIT), 14 * DAY)
    # attempts of one job at most (its first, reruns after preemptions and failed boots, retries): a spec whose
    # max_restarts and retry.max ask for more is refused
    max_attempts_per_job: int = checked(whole(1, MAX_ATTEMPTS), 20)
    default_stall_timeout: int = checked(duration(MAX_STALL_TIMEOUT), 30 * 60)
    default_boot_timeout: int = checked(duration(MAX_BOOT_TIMEOUT), 15 * 60)
    # nodes one owner's jobs may hold at once (launching, running, preempted for a rerun, held for a look)
    max_active_instances_per_owner: int = checked(whole(0, 100_000), 64)
    # nodes all owners' jobs together may hold at once; unset: no deployment-wide cap
    max_active_instances: int | None = checked(optional(whole(1, 100_000)), None)
    # instance family -> nodes all owners' jobs of that family may hold at once (p4d: p4d.24xlarge; a2: a2-highgpu-1g)
    max_active_by_family: dict[str, int] = checked(mapping(r"^[a-z][a-z0-9]{0,15}$", whole(1, 100_000), 100),
                                                   factory=dict)
    # fair share under max_active_instances: when the cap binds, the owner holding the fewest nodes per weight goes
    # next; an owner not named weighs 1
    owner_weights: dict[str, float] = checked(mapping(LABEL_KEY, number(0, 1000, above=True), 1000), factory=dict)
    # name -> {value, owners}: the priorities specs may name
    priority_classes: dict[str, PriorityClass] = checked(mapping(LABEL_KEY, nested(PriorityClass), 100), factory=dict)
    budgets: BudgetPolicy = checked(nested(BudgetPolicy), factory=BudgetPolicy)
    aws: AwsPlacement = checked(nested(AwsPlacement), factory=AwsPlacement)
    gcp: GcpPlacement = checked(nested(GcpPlacement), factory=GcpPlacement)
    safety: SafetyPolicy = checked(nested(SafetyPolicy), factory=SafetyPolicy)
    idle_gpu: IdleGpuPolicy = checked(nested(IdleGpuPolicy), factory=IdleGpuPolicy)
    access: AccessPolicy = checked(nested(AccessPolicy), factory=AccessPolicy)
    # USD per instance-hour; these win over the price table jobplane ships (jobplane.model.prices): on-demand, and
    # Spot where the cloud gives none (GCE)
    prices: dict[str, float] = checked(mapping(INSTANCE_TYPE, number(0, 1e6), 10_000), factory=dict)
    spot_prices: dict[str, float] = checked(mapping(INSTANCE_TYPE, number(0, 1e6), 10_000), factory=dict)
    # USD a job may cost in all (its attempts' instance time at their prices): a spec's max_cost, else this; at it the
    # job is asked to stop (it checkpoints) and ends naming max_cost. Unset: no per-job cap
    default_max_cost: float | None = checked(optional(number(0, MAX_JOB_USD, above=True)), None)
    max_cost_ceiling: float | None = checked(optional(number(0, MAX_JOB_USD, above=True)), None)  # a spec's above
    # it is refused

    # Effective per-job values: the spec wins, within the policy's ceiling.
    def max_runtime(self, spec: JobSpec) -> int:
        return min(spec.max_runtime or self.default_max_runtime, self.max_runtime_ceiling)

    def max_cost(self, spec: JobSpec) -> float | None:
        """USD the job may cost in all: its max_cost, else the policy's default, never over the ceiling (None: no
        cap)."""
        found = spec.max_cost if spec.max_cost is not None else self.default_max_cost
        ceiling = self.max_cost_ceiling
        return ceiling if found is None or (ceiling is not None and found > ceiling) else found

    def vm_lifetime(self, spec: JobSpec) -> int:
        """How long a VM may live, its own backstop (EC2: the bootstrap's shutdown; GCE: maxRunDuration): the
        uptime cap, plus the debug hold a FAILED attempt may keep it for."""
        return self.max_runtime(spec) + (spec.debug_hold or 0)

    def max_wait(self, spec: JobSpec) -> int:
        """Counted from submission: no attempt starts after it (a spec recorded before the ceiling included)."""
        return min(spec.max_wait or self.default_max_wait, self.max_wait_ceiling)

    def max_attempts(self, spec: JobSpec) -> int:
        """Attempts the job may have in all: its first, max_restarts reruns and retry.max retries, within the
        policy's max_attempts_per_job (lowered since the job was accepted, it still holds)."""
        return min(spec.attempts, self.max_attempts_per_job)

    def families(self, spec: JobSpec) -> list[str]:
        """The capped instance families (max_active_by_family) the spec's instance types are of: its attempts hold a
        place in each, since which type it gets is decided at launch."""
        return sorted({f for t in spec.instance_types if (f := accelerators.family(spec.cloud, t))
                       in self.max_active_by_family})

    def weight(self, owner: str) -> float:
        return self.owner_weights.get(owner, 1.0)

    def priority(self, spec: JobSpec) -> int:
        """The spec's priority: its class's value (0 without one, or with a class the policy no longer has)."""
        found = self.priority_classes.get(spec.priority or "")
        return found.value if found is not None else 0

    def priority_class(self, value: int) -> str | None:
        """The priority class a value is the value of, as people name it (several with one value: 'a/b'); None: no
        class has it (0 without a class, or a class the policy no longer has)."""
        return "/".join(sorted(n for n, c in self.priority_classes.items() if c.value == value)) or None

    def stall_timeout(self, spec: JobSpec) -> int:
        return spec.stall_timeout or self.default_stall_timeout

    def boot_timeout(self, spec: JobSpec) -> int:
        return spec.boot_timeout or self.default_boot_timeout

    def image(self, spec: JobSpec, instance_type: str) -> str:
        """The image for one instance type of the spec: its own, else the cloud's CPU or GPU default."""
        placement = self.aws if spec.cloud == "aws" else self.gcp
        return spec.image or placement.default_for(instance_type, gpu=spec.accelerators is not None)


DEFAULT_POLICY = Policy()


def parse_policy(text: str | bytes | None) -> Policy:
    """Parse config/policy.yaml; None (file absent) or an empty file gives the defaults. SpecError names each
    field that is wrong."""
    if text is None or not str(text if isinstance(text, str) else text.decode()).strip():
        return DEFAULT_POLICY
    return _parsed(text)


@functools.lru_cache(maxsize=8)
def _parsed(text: str | bytes) -> Policy:
    """A warm function reads the same policy at every run: parsed (and checked, field by field) once per text. A
    Policy is shared as DEFAULT_POLICY is: frozen, and nothing changes its fields' dicts and lists."""
    return policy_from(load_document(text, "policy"))


def policy_from(document: object) -> Policy:
    """The policy a parsed document (a mapping) gives; SpecError names each field that is wrong."""
    return build(Policy, document)


def check_against_policy(spec: JobSpec, policy: Policy) -> list[FieldError]:
    """Problems with a valid spec under this platform's policy (each names the spec's field)."""
    errors: list[FieldError] = []
    for i, itype in enumerate(spec.instance_types):
        if not any(fnmatchcase(itype, pattern) for pattern in policy.allowed_instance_types):
            path = "instance_type" if isinstance(spec.instance_type, str) else f"instance_type[{i}]"
            errors.append(FieldError(path, f"{itype!r} is not allowed by the platform policy "
                                           f"(allowed: {', '.join(policy.allowed_instance_types)})"))
    if spec.num_nodes > policy.max_nodes_per_job:
        errors.append(FieldError("num_nodes", f"{spec.num_nodes} exceeds the policy's maximum of "
                                              f"{policy.max_nodes_per_job} nodes per job"))
    if spec.max_runtime and spec.max_runtime > policy.max_runtime_ceiling:
        errors.append(FieldError("max_runtime", f"{format_duration(spec.max_runtime)} exceeds the policy "
                                                f"ceiling of {format_duration(policy.max_runtime_ceiling)}"))
    if spec.max_wait and spec.max_wait > policy.max_wait_ceiling:
        errors.append(FieldError("max_wait", f"{format_duration(spec.max_wait)} exceeds the policy ceiling of "
                                             f"{format_duration(policy.max_wait_ceiling)} (max_wait_ceiling)"))
    if spec.attempts > policy.max_attempts_per_job:
        retries = spec.retry.max if spec.retry is not None else 0
        errors.append(FieldError(
            "max_restarts" if 1 + spec.max_restarts > policy.max_attempts_per_job else "retry.max",
            f"max_restarts {spec.max_restarts} and retry.max {retries} allow {spec.attempts} attempts; the policy "
            f"allows {policy.max_attempts_per_job} (max_attempts_per_job)"))
    if spec.num_nodes > policy.max_active_instances_per_owner:
        errors.append(FieldError("num_nodes", f"{spec.num_nodes} nodes can never fit the owner quota of "
                                              f"{policy.max_active_instances_per_owner} active instances"))
    errors += _priority_problems(spec, policy)
    errors += _price_problems(spec, policy)
    cap = policy.max_active_instances
    if cap is not None and spec.num_nodes > cap:
        errors.append(FieldError("num_nodes", f"{spec.num_nodes} nodes can never fit the deployment's cap of {cap} "
                                              "active instances (max_active_instances)"))
    for kind in policy.families(spec):
        if spec.num_nodes > (limit := policy.max_active_by_family[kind]):
            errors.append(FieldError("num_nodes", f"{spec.num_nodes} nodes can never fit the cap of {limit} active "
                                                  f"instances of family {kind} (max_active_by_family.{kind})"))
    if spec.sweep is not None and spec.sweep.max_parallel * spec.num_nodes > policy.max_active_instances_per_owner:
        errors.append(FieldError("sweep.max_parallel", f"{spec.sweep.max_parallel} trials of {spec.num_nodes} "
                                                       f"node(s) at once can never fit the owner quota of "
                                                       f"{policy.max_active_instances_per_owner} active instances"))
    array = spec.array  # an array's own spec, not a member's (it was checked when the array was)
    if array is not None and array.index is None and array.max_parallel is not None and \
            array.max_parallel * spec.num_nodes > policy.max_active_instances_per_owner:
        errors.append(FieldError("array.max_parallel", f"{array.max_parallel} members of {spec.num_nodes} node(s) at "
                                                       f"once can never fit the owner quota of "
                                                       f"{policy.max_active_instances_per_owner} active instances"))
    return errors


def _price_problems(spec: JobSpec, policy: Policy) -> list[FieldError]:
    """A cap on a job's cost over the policy's ceiling; an instance type and market priced above the spec's
    max_price; and, for a job whose cost something limits (its owner's budget, a max_cost), a type and market nobody
    prices (the policy's `prices` can)."""
    from jobplane.model import prices

    errors: list[FieldError] = []
    ceiling = policy.max_cost_ceiling
    if spec.max_cost is not None and ceiling is not None and spec.max_cost > ceiling:
        errors.append(FieldError("max_cost", f"${spec.max_cost:,.2f} exceeds the policy ceiling of ${ceiling:,.2f} "
                                             "(max_cost_ceiling)"))
    offers = prices.offers(spec, policy)
    for offer in offers:
        if spec.max_price is not None and offer.price is not None and offer.price > spec.max_price \
                and not prices.held_by_cloud(offer, spec.max_price):
            errors.append(FieldError("max_price", f"{offer} costs ${offer.price:,.4f} an hour, above max_price "
                                                  f"${spec.max_price:,.4f}"))
    limited = [why for why, on in (("its owner's budget (budgets.monthly_usd)", policy.budgets.limit(spec.owner)),
                                   ("max_cost", policy.max_cost(spec))) if on is not None]
    unpriced = [str(o) for o in offers if o.price is None]
    if limited and unpriced:
        errors.append(FieldError("prices", f"{', '.join(unpriced)}: no price in the price table or the policy's "
                                           f"prices, so {' and '.join(limited)} cannot count its cost; the platform "
                                           "team can give one in config/policy.yaml (prices:, spot_prices:)"))
    return errors


def _priority_problems(spec: JobSpec, policy: Policy) -> list[FieldError]:
    if spec.priority is None:
        return []
    found = policy.priority_classes.get(spec.priority)
    if found is None:
        known = ", ".join(sorted(policy.priority_classes)) or "none: the policy defines no priority_classes"
        return [FieldError("priority", f"{spec.priority!r} is not a priority class of this platform ({known})")]
    if found.owners is not None and spec.owner not in found.owners:
        return [FieldError("priority", f"owner {spec.owner!r} may not use priority class {spec.priority!r} "
                                       f"(its owners: {', '.join(found.owners) or 'none'})")]
    return []


def check_against_deployment(spec: JobSpec, cloud: str, region: str | None) -> list[FieldError]:
    """Problems with running this spec on this deployment, which launches on one cloud in one region (its
    network, service accounts and policy are regional): a spec for elsewhere is refused, never moved."""
    if spec.cloud != cloud:
        default = "" if "cloud" in spec.model_fields_set else " (the default when cloud is not set)"
        return [FieldError("cloud", f"{spec.cloud!r}{default} is not this deployment's cloud {cloud!r}: "
                                    f"submit the job to a deployment on {spec.cloud}, or set cloud: {cloud}")]
    if region is None:
        return []
    errors: list[FieldError] = []
    if spec.region is not None and spec.region != region:
        errors.append(FieldError("region", f"{spec.region!r} is not this deployment's region {region!r}: "
                                           f"submit the job to a deployment there, or drop the field"))
    for i, zone in enumerate(spec.zones):
        # us-east-1a and us-central1-b are in their region; europe-west10-a is not in europe-west1
        if not zone.startswith(region) or zone[len(region):len(region) + 1].isdigit():
            errors.append(FieldError(f"zones[{i}]", f"{zone!r} is not a zone of this deployment's region {region!r}"))
    return errors
