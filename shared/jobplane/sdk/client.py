"""The registry a client submits jobs to and looks them up in: one Settings (the context the CLI builds from its
options and the environment), connected on first use."""

from __future__ import annotations

import builtins
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from jobplane.clouds.base import SecretStore
from jobplane.decide import budget as budget_decisions
from jobplane.model.errors import FieldError, SpecError
from jobplane.model.policy import Policy
from jobplane.model.secrets import SecretInfo
from jobplane.model.spec import parse_spec
from jobplane.model.states import LIVE, State
from jobplane.model.yaml_input import load_document
from jobplane.ops import admissible, backend, budgets, jobs, queue, tensorboard
from jobplane.ops import secrets as secret_ops
from jobplane.ops import usage as quotas
from jobplane.sdk.connection import Connection
from jobplane.sdk.errors import ConfigurationError, InvalidSpec, Refused, translated
from jobplane.sdk.job import Job
from jobplane.sdk.sweep import Sweep
from jobplane.sdk.watch import Watch
from jobplane.settings import Settings, parse_registry
from jobplane.store.registry import JobExists as JobExistsBelow
from jobplane.store.registry import Registry
from jobplane.sweeps import ops
from jobplane.views import cost

UploadProgress = backend.Progress  # a context around one upload that yields advance(bytes sent since last call)
SpecSource = str | os.PathLike[str] | Mapping[str, Any] | jobs.Submission
ID_TRIES = 32  # fresh ids to draw when the ones drawn are being submitted by this process already

# The jobs this process is submitting, per deployment: a job id is held from its plan until its drop is written,
# so two threads never upload code under one id (the registry's checks cannot see a submission in flight).
_submitting: set[tuple[str, str]] = set()
_submitting_lock = threading.Lock()

Budget = budget_decisions.Budget  # an owner's spend this month against its budget (Client.budgets)


def _owner(owner: str | None) -> str:
    return owner or secret_ops.DEFAULT_OWNER


def prepare(spec: str | os.PathLike[str] | Mapping[str, Any], *, code: str | os.PathLike[str] | None = None,
            hyperparameters: Mapping[str, Any] | None = None, owner: str | None = None,
            id: str | None = None, priority: str | None = None) -> jobs.Submission:
    """Check a spec the way the launcher will, without a registry, and return what submit() would drop.

    spec is a YAML file's path or the spec as a mapping; a relative `code:` in it is relative to the file's
    directory (to the working directory for a mapping). code is the directory to upload as the job's working
    directory; hyperparameters override or add to the spec's; owner submits to `queue/<owner>/`. id names the job
    (default: from the spec's `id`, else its name and the time); priority is a priority class of the policy, over
    the spec's `priority:`. InvalidSpec names each problem's field; OSError if the file cannot be read.
    """
    if isinstance(spec, Mapping):
        path, text = Path("<spec>"), yaml.safe_dump(dict(spec), sort_keys=False)
    else:
        path = Path(spec)
        text = path.read_text()
    if priority is not None:
        with translated():
            try:
                document = load_document(text, path.name)
            except SpecError as exc:
                raise jobs.SpecInvalid(str(path), exc.errors) from None
        text = yaml.safe_dump({**document, "priority": priority}, sort_keys=False)
    code_dir = Path(code) if code is not None else None
    if code_dir is not None and not code_dir.is_dir():
        raise InvalidSpec([FieldError("code", f"{str(code_dir)!r} is not a directory")])
    with translated():
        return jobs.plan_submission(path, text, code_dir=code_dir, job_id=id, hyperparameters=hyperparameters,
                                    owner=owner)


class Client:
    """A jobplane registry: `Client("s3://my-bucket")`, `Client("gs://my-bucket/team-a")`, or `Client()` for the
    one the CLI would use (`JOBPLANE_BUCKET`, `JOBPLANE_ROOT`, `JOBPLANE_CLOUD`, `JOBPLANE_REGION`).

    bucket is `s3://BUCKET[/ROOT]`, `gs://BUCKET[/ROOT]` or a bare bucket name, whose cloud is `cloud`
    ("aws" or "gcp"; default `JOBPLANE_CLOUD`, else aws). root is the registry's prefix in the bucket (default:
    the URL's path, else `JOBPLANE_ROOT`), region the deployment's. progress is entered around each code upload
    with the bundle's path and yields advance(bytes sent since the last call), for a progress bar.

    The cloud SDKs find their credentials and endpoints as usual (boto3's chain and `AWS_ENDPOINT_URL`;
    Application Default Credentials and `STORAGE_EMULATOR_HOST`). Nothing is reached until first used;
    ConfigurationError at once if the registry is not named. A client may be shared by threads.
    """

    def __init__(self, bucket: str | None = None, *, root: str | None = None, region: str | None = None,
                 cloud: str | None = None, progress: UploadProgress | None = None) -> None:
        try:
            settings = Settings.from_env(bucket, cloud, region)
            in_url = parse_registry(bucket)[2] if bucket else None
        except RuntimeError as exc:
            raise ConfigurationError(str(exc)) from None
        if root is not None:
            if in_url is not None and in_url != root.strip("/"):
                raise ConfigurationError(f"the registry {bucket} has the root {in_url!r}, not {root!r}: drop root= "
                                         "or the URL's path")
            settings = dataclasses.replace(settings, root=root.strip("/"))
        self._setup(settings, progress)

    @classmethod
    def from_settings(cls, settings: Settings, *, progress: UploadProgress | None = None,
                      connected: jobs.Backend | None = None) -> Client:
        """A client of the registry these settings name (jobplane.settings.Settings, as the entry points read
        them from the environment). connected: that registry and its cloud's adapters already built
        (jobplane.ops.jobs.Backend), used instead of connecting on first use: an in-memory registry in tests and
        benchmarks."""
        client = cls.__new__(cls)
        client._setup(settings, progress, connected)
        return client

    def _setup(self, settings: Settings, progress: UploadProgress | None,
               connected: jobs.Backend | None = None) -> None:
        self._settings = settings
        self._connection = Connection(settings, progress or backend.no_progress, connected)

    # ---- the context ----------------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """What names the registry: bucket, root, cloud, region (and the GCP project and endpoints)."""
        return self._settings

    @property
    def cloud(self) -> str:
        """"aws" or "gcp"."""
        return self._settings.cloud

    @property
    def url(self) -> str:
        """The registry: s3://BUCKET[/ROOT] or gs://BUCKET[/ROOT]."""
        return self._settings.url + (f"/{self._settings.root}" if self._settings.root else "")

    @property
    def _registry(self) -> Registry:
        return self._connection.registry

    # ---- jobs -----------------------------------------------------------------------------------------------
    def submit(self, spec: SpecSource, *, code: str | os.PathLike[str] | None = None,
               hyperparameters: Mapping[str, Any] | None = None, owner: str | None = None, id: str | None = None,
               priority: str | None = None, on_code: Callable[[int, str], None] | None = None) -> Job:
        """Submit a job: check it against the policy in force, upload its code (a tar.gz of `code`, or of the spec's
        relative `code:`), then drop its spec into `queue/` (`queue/<owner>/`). From then on the job exists: it is
        QUEUED until the launcher takes it.

        spec is a YAML file's path, the spec as a mapping, or what prepare() returned (then give nothing else).
        hyperparameters override or add to the spec's (`{"lr": 0.02}`). owner submits to `queue/<owner>/` and
        `code/<owner>/` (default: the spec's `owner:`). id names the job (default: the spec's `id`, else its
        name and the time, unique in this process). priority is a priority class, over the spec's `priority:`.
        on_code(files, uri) is told what was uploaded.

        InvalidSpec names each problem's field, before anything is uploaded: what the launcher would refuse by the
        policy in force (an instance type, a priority class unknown or not the owner's, an array that can never fit
        the quotas), an `after:` naming no job or array, an owner at its budget when the policy refuses new jobs
        past it, a spec for another cloud than the registry's. JobExists or Refused if the id is taken.
        """
        if isinstance(spec, jobs.Submission):
            if code is not None or hyperparameters is not None or owner is not None or id is not None \
                    or priority is not None:
                raise TypeError("submit(prepared): code, hyperparameters, owner, id and priority were given to "
                                "prepare()")
            plan = spec
            if not self._hold(plan.job_id):
                raise Refused(f"job {plan.job_id!r} is already queued")
        else:
            plan = self._plan(spec, code, hyperparameters, owner, id, priority)
        try:
            with translated():
                self._check(plan)
                for _ in range(ID_TRIES):
                    try:
                        return Job(self._connection, jobs.submit(self._connection.backend(), plan, on_bundle=on_code))
                    except (JobExistsBelow, jobs.AlreadyQueued):
                        if not plan.drawn or isinstance(spec, jobs.Submission):
                            raise
                    # a drawn id a job submitted a moment ago (in this second, by this process or another) has
                    # already: nothing was uploaded or dropped, so draw another
                    self._release(plan.job_id)
                    plan = self._plan(spec, code, hyperparameters, owner, id, priority)
                raise jobs.AlreadyQueued(plan.job_id)
        finally:
            self._release(plan.job_id)

    def _check(self, plan: jobs.Submission) -> None:
        """What the launcher would refuse by the registry as it is now (jobplane.ops.admissible), before any upload;
        and a secret the spec names that its owner does not have."""
        spec = parse_spec(yaml.safe_dump(plan.doc), job_id=plan.job_id)
        errors = admissible.problems(self._registry, spec, plan.job_id, datetime.now(UTC))
        if spec.secret_names:
            with translated():
                errors += secret_ops.unknown(self._secret_store(), spec)
        if errors:
            raise jobs.SpecInvalid(None, errors)

    # ---- secrets: values go in, never out (a job's agent reads them with the job's credentials) ----------------
    def _secret_store(self) -> SecretStore:
        with translated():
            return backend.secrets(self._settings)

    def set_secret(self, name: str, value: bytes | str, *, owner: str | None = None) -> None:
        """Set or rotate secret `name` of `owner` (default: `default`, a single-team deployment's), up to 64 KiB; a job
        reads it by name (`secrets:`), its next attempt the new value. InvalidSpec names a bad name or value."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        with translated():
            secret_ops.put(self._secret_store(), _owner(owner), name, data)

    def secrets(self, *, owner: str | None = None) -> builtins.list[SecretInfo]:
        """The secrets' names, owners and when each was set (of every owner without one): never a value."""
        with translated():
            return secret_ops.listed(self._secret_store(), owner)

    def remove_secret(self, name: str, *, owner: str | None = None) -> bool:
        """Delete a secret; False if there was none. A job naming it is refused at submit from then on."""
        with translated():
            return secret_ops.remove(self._secret_store(), _owner(owner), name)

    def _release(self, job_id: str) -> None:
        with _submitting_lock:
            _submitting.discard((self._settings.deployment, job_id))

    def _plan(self, spec: str | os.PathLike[str] | Mapping[str, Any], code: str | os.PathLike[str] | None,
              hyperparameters: Mapping[str, Any] | None, owner: str | None, job_id: str | None,
              priority: str | None) -> jobs.Submission:
        """prepare(), with an id nobody in this process is submitting: a drawn one is drawn again."""
        for _ in range(ID_TRIES):
            plan = prepare(spec, code=code, hyperparameters=hyperparameters, owner=owner, id=job_id, priority=priority)
            if self._hold(plan.job_id):
                return plan
            if not plan.drawn:
                break
        raise Refused(f"job {plan.job_id!r} is already queued")

    def _hold(self, job_id: str) -> bool:
        with _submitting_lock:
            held = (self._settings.deployment, job_id)
            if held in _submitting:
                return False
            _submitting.add(held)
            return True

    def get(self, job_id: str) -> Job:
        """The job with this id, recorded, still in queue/ or rejected; JobNotFound if there is none."""
        with translated():
            return Job(self._connection, jobs.find(self._registry, job_id))

    def list(self, *, state: State | str | Iterable[State | str] | None = None, owner: str | None = None,
             label: str | Mapping[str, str] | None = None, include_finished: bool = False) -> list[Job]:
        """Live jobs, queued ones included; with include_finished (or a `state` that is not live) finished and
        rejected ones too. Live jobs by id, then drops in queue/, then rejected drops.

        state keeps the jobs in it (a state or several); owner those of one owner; label those carrying a label
        ("team=nlp", "team" for any value, or a mapping of several).
        """
        states = None if state is None else {State(s) for s in ([state] if isinstance(state, str) else state)}
        everything = include_finished or bool(states and states - LIVE)
        with translated():
            views = jobs.list_views(self._registry, everything)
        wanted = _label_filter(label)
        return [Job(self._connection, v) for v in views
                if (states is None or v.state in states) and (owner is None or (v.spec and v.spec.owner == owner))
                and (wanted is None or (v.spec is not None and wanted(v.spec.labels)))]

    # ---- the queue and the policy ------------------------------------------------------------------------------
    def queue(self, *, owner: str | None = None) -> builtins.list[queue.Standing]:
        """The waiting jobs (or one owner's): each owner's line in the order it is admitted, with each job's
        position, priority (`.priority_name`: its class) and why it waits, in the words its record's reason has (`the
        deployment has 8 active instances; 1 more would exceed the quota of 8 (max_active_instances)`), then the jobs
        waiting for their `after:` (`dependency: waiting for prep (RUNNING)`), then each live array's members not
        dropped yet (one row an array: `.size`, `.not_dropped`)."""
        with translated():
            return queue.standing(self._registry, owner) + ops.array_waits(self._registry, owner)

    def usage(self, *, owner: str | None = None, now: datetime | None = None) -> quotas.Usage:
        """Who uses what of the quotas, as the admission counts it: `.owners` (each owner holding or waiting for
        nodes, or named by the policy's budgets or weights: `.in_use` of `.quota` nodes, `.waiting` jobs, `.weight`,
        `.share` of the deployment's cap, `.budget` this month), `.deployment` (the cap, or None) and `.families`
        (each instance family's cap), each cap with `.in_use` and `.limit`."""
        with translated():
            return quotas.usage(self._registry, owner, now)

    def policy(self) -> Policy:
        """The policy in force (`config/policy.yaml`, or the defaults without one): quotas and caps, priority
        classes, budgets, limits, images, prices (jobplane.model.policy.Policy)."""
        with translated():
            return self._registry.policy()

    # ---- sweeps and arrays ------------------------------------------------------------------------------------

    def sweeps(self, *, include_finished: bool = False) -> builtins.list[Sweep]:
        """The sweeps still at work (RUNNING, or cancelled with trials being stopped), or every sweep; by id."""
        with translated():
            return [Sweep(self._connection, r) for r in ops.records(self._registry, include_finished)]

    def sweep(self, sweep_id: str, *, wait: float = 0, interval: float = 1.0) -> Sweep:
        """The sweep with this id. One just submitted is a drop in queue/ until the launcher records it (within
        seconds): with `wait`, up to that many seconds are waited for it, looking every `interval`. SweepNotFound
        if there is none (then), saying what the id is instead: still in queue/ (`.queued`), rejected, a job."""
        with translated():
            return Sweep(self._connection, ops.find(self._registry, sweep_id, wait, interval))

    def arrays(self, *, include_finished: bool = False) -> builtins.list[Sweep]:
        """The arrays still at work (or every array), by id, each as `array()` gives it."""
        with translated():
            return [Sweep(self._connection, r) for r in ops.records(self._registry, include_finished, arrays=True)]

    def array(self, array_id: str) -> Sweep:
        """The array with this id (a spec with `array:`), as a sweep whose trials are its members, jobs
        `<id>-0`, `<id>-1`, ...: `.state`, `.describe()` (the members by index, their states and cost),
        `.cancel()` (every member not ended). SweepNotFound ("no array ...") if there is none, saying what the id
        is instead."""
        with translated():
            return Sweep(self._connection, ops.find(self._registry, array_id, array=True))

    def watch(self) -> Watch:
        """The registry's jobs and their output for looking at again and again (a dashboard, a monitoring loop):
        each look reads only what the registry's listings say changed since the previous one."""
        return Watch(self._connection)

    def cost(self, *, by: str = "job", since: datetime | None = None,
             now: datetime | None = None) -> builtins.list[cost.Row]:
        """Every recorded job's estimated cost (instance time after `since`), summed by group and dearest first:
        by "job", "owner", "type" (instance type), "market" (spot or on-demand, per attempt), "label" (each
        key=value) or "label:KEY". Each row has `.group`, `.jobs` and `.cost` (`.usd`, `.instance_hours`)."""
        if by not in cost.GROUPS and not by.startswith("label:"):
            raise ValueError(f"by={by!r}: use one of {', '.join(cost.GROUPS)} or label:KEY")
        with translated():
            return jobs.cost_rows(self._registry, by, since, now)

    def budgets(self, *, now: datetime | None = None) -> builtins.list[Budget]:
        """Each owner with a budget in the policy: its spend this calendar month (UTC) against it, as the admission
        counts it (`.owner`, `.spent`, `.budget`, `.percent`, `.figures`: '$412.10 of $500.00 this month (82%)')."""
        with translated():
            return budgets.standings(self._registry, now or datetime.now(UTC))

    def tensorboard(self, job_ids: Iterable[str], dest: str | Path) -> TensorBoardCopy:
        """A local copy of these jobs' TensorBoard runs under dest (one run per job and attempt:
        <job>/attempt-<n>), brought in step with the bucket by each `.sync()`. JobNotFound for an unknown id."""
        found = [self.get(job_id).data for job_id in job_ids]
        return TensorBoardCopy(tensorboard.LocalRuns(self._connection.registry, Path(dest), found))

    def gpu_idle_hours(self, *, by: str = "owner", since: datetime | None = None) -> dict[str, float]:
        """GPU-hours spent under 10% utilization per group (by as in cost()), from every job's system metrics
        (after `since`); reads each job's system metric chunks, so it is slower than cost()."""
        if by not in cost.GROUPS and not by.startswith("label:"):
            raise ValueError(f"by={by!r}: use one of {', '.join(cost.GROUPS)} or label:KEY")
        with translated():
            return jobs.gpu_idle_hours(self._registry, by, since)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"


class TensorBoardCopy:
    """Jobs' TensorBoard runs copied to a local directory (`.dest`), for TensorBoard to serve."""

    def __init__(self, runs: tensorboard.LocalRuns) -> None:
        self._runs = runs

    @property
    def dest(self) -> Path:
        return self._runs.dest

    def sync(self) -> tensorboard.Synced:
        """Fetch what changed since the last sync (`.files`, `.bytes`); `.runs` names every run found."""
        with translated():
            return self._runs.sync()


def _label_filter(label: str | Mapping[str, str] | None) -> Callable[[Mapping[str, str]], bool] | None:
    if label is None:
        return None
    if isinstance(label, str):
        key, sep, value = label.partition("=")
        return lambda labels: key in labels and (not sep or labels[key] == value)
    wanted = dict(label)
    return lambda labels: all(labels.get(k) == v for k, v in wanted.items())

