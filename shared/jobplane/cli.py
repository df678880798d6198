"""`jobplane ...`: the command line for ML engineers and platform teams."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

import click
import yaml
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from jobplane import cost, jobs, jobview, metricview, yaml_input
from jobplane.errors import FieldError, SpecError
from jobplane.jobview import COLUMNS, Status, display, header, view_row
from jobplane.policy import DEFAULT_POLICY, Policy, check_against_policy, parse_policy
from jobplane.registry import JobExists, JobNotFound, TransitionRefused, utcnow
from jobplane.settings import Settings
from jobplane.spec import format_duration, json_schema_text, parse_duration, parse_spec, spec_to_json
from jobplane.states import State


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobplane")
def cli() -> None:
    """jobplane: run ML training jobs on plain cloud VMs from specs dropped in a bucket.

    \b
    \b
    Quick start (no cloud account needed):
      jobplane local up                                   # shell 1: the local cloud
      jobplane submit examples/demo.yaml --code examples/train -f
      jobplane ls && jobplane wait ID --for terminal --timeout 10m
      jobplane metrics ID --plot loss.png
    """


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Also check the specs against this platform policy (config/policy.yaml).")
def validate(files: tuple[Path, ...], policy_file: Path | None) -> None:
    """Check job specs; print one line per problem as FILE: field.path: message.

    \b
    Exits 0 when every file is valid, 1 otherwise.
    Example:
      jobplane validate examples/*.yaml --policy config/policy.yaml
    """
    policy: Policy = DEFAULT_POLICY
    if policy_file is not None:
        try:
            policy = parse_policy(policy_file.read_text())
        except SpecError as exc:
            for err in exc.errors:
                click.echo(f"{policy_file}: {err}", err=True)
            sys.exit(1)
    failed = False
    for path in files:
        problems = validate_file(path, policy)
        for err in problems:
            click.echo(f"{path}: {err}", err=True)
        failed = failed or bool(problems)
        if not problems:
            click.echo(f"{path}: ok")
    sys.exit(1 if failed else 0)


def validate_file(path: Path, policy: Policy) -> list[FieldError]:
    try:
        text = path.read_text()
    except OSError as exc:
        return [FieldError("(file)", f"cannot read: {exc.strerror}")]
    try:
        spec = parse_spec(text, source=path.name)
    except SpecError as exc:
        return exc.errors
    return check_against_policy(spec, policy)


@cli.command()
def schema() -> None:
    """Print the job spec's JSON Schema (also at schema/jobspec.schema.json).

    \b
    Example:
      jobplane schema > jobspec.schema.json
    """
    click.echo(json_schema_text(), nl=False)


# ---- registry commands -------------------------------------------------------------------------------------
class UserError(click.ClickException):
    """One clear line and exit 1 (ClickException prints 'Error: ...')."""


F = TypeVar("F", bound=Callable[..., Any])


def registry_options(func: F) -> F:
    """--bucket / --cloud / --region / --endpoint, each defaulting to the environment a `local up` writes."""
    func = click.option("--endpoint", envvar="AWS_ENDPOINT_URL",
                        help="AWS only: S3/EC2 endpoint URL, e.g. the local cloud's (env AWS_ENDPOINT_URL). On GCP "
                             "set STORAGE_EMULATOR_HOST and JOBPLANE_COMPUTE_ENDPOINT.")(func)
    func = click.option("--region", help="The deployment's region (env JOBPLANE_REGION; on AWS also AWS_REGION).")(func)
    func = click.option("--cloud", type=click.Choice(["aws", "gcp"]),
                        help="Cloud of a bare bucket name (env JOBPLANE_CLOUD; default aws); s3:// and gs:// URLs "
                             "say it themselves.")(func)
    func = click.option("--bucket", envvar="JOBPLANE_BUCKET",
                        help="Registry: s3://BUCKET[/ROOT], gs://BUCKET[/ROOT] or a bucket name (env "
                             "JOBPLANE_BUCKET).")(func)
    return func


def connect(bucket: str | None, cloud: str | None, region: str | None, endpoint: str | None) -> jobs.Backend:
    """The registry the options name, on its cloud: S3 and EC2, or GCS and Compute Engine (jobplane.backend)."""
    from jobplane import backend

    try:
        settings = Settings.from_env(bucket, cloud, region)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    if settings.cloud == "aws" and endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    elif endpoint and click.get_current_context().get_parameter_source("endpoint") == ParameterSource.COMMANDLINE:
        raise UserError("--endpoint is for AWS; on GCP set STORAGE_EMULATOR_HOST (GCS) and JOBPLANE_COMPUTE_ENDPOINT "
                        "(the Compute Engine API)")
    return backend.connect(settings, upload_progress)


@contextlib.contextmanager
def upload_progress(path: Path) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("uploading code"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("code", total=path.stat().st_size)
        yield lambda sent: progress.advance(task, sent)


# Google's libraries: an API refusal (google.api_core), no credentials (google.auth), GCS unreachable (requests)
SDK_ERRORS = ("google.api_core.", "google.auth.", "google.cloud.", "requests.exceptions")


def cloud_errors(func: F) -> F:
    """Turn the errors a user can cause or meet (no bucket, no credentials, unknown job) into one line."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except (JobNotFound, JobExists, TransitionRefused, jobs.JobError) as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # the cloud SDKs' errors without importing an SDK here
            name = type(exc).__name__
            if name in ("NoCredentialsError", "EndpointConnectionError", "ClientError", "NoSuchBucket",
                        "ParamValidationError", "ConnectionClosedError", "NoRegionError", "BackendError") \
                    or type(exc).__module__.startswith(SDK_ERRORS):
                raise UserError(f"{name}: {exc}") from None
            raise
    return cast(F, wrapper)


class StatusLine:
    """A job's one-line status on stderr: rewritten in place on a terminal; elsewhere (a log, a pipe) one line
    each time the phase changes, so the record stays readable."""

    def __init__(self) -> None:
        self.err: TextIO = sys.stderr
        self.tty = self.err.isatty()
        self.text = ""
        self.phase: str | None = None

    def show(self, status: Status) -> None:
        if self.tty:  # one screen line, or clearing it would leave the wrapped rest behind
            self.text = status.text[:max(20, shutil.get_terminal_size().columns - 1)]
            self.err.write("\r\x1b[K" + self.text)
            self.err.flush()
        elif status.phase != self.phase:
            click.echo(f"status: {status.text}", err=True)
        self.phase = status.phase

    def above(self, text: str) -> None:
        """Print job output to stdout with the status line kept below it."""
        self.clear()
        click.echo(text, nl=not text.endswith("\n") and bool(text))
        if self.tty and self.text:
            self.err.write(self.text)
            self.err.flush()

    def clear(self) -> None:
        if self.tty and self.text:
            self.err.write("\r\x1b[K")
            self.err.flush()

    def end(self) -> None:
        """The status line is done: what follows starts on a clean line."""
        self.clear()
        self.text = ""


def follow_job(backend: jobs.Backend, job_id: str, goal: jobs.Goal, *, interval: float, timeout: float | None = None,
               logs: bool = False, attempt: int | None = None, rank: int | None = None) -> int:
    """Follow a job to goal with a status line (and its output with logs); return the exit code to use.

    Ctrl-C stops following, never the job."""
    line = StatusLine()
    try:
        first = jobs.find(backend.reg, job_id)  # a job that does not exist is an error at once
        many_nodes = first.num_nodes > 1 and rank is None
        reran = attempt is None and first.attempt > 1

        def on_chunk(chunk: jobs.Chunk) -> None:
            tag = many_nodes or (attempt is None and (reran or chunk.attempt > 1))
            line.above(jobs.tagged(chunk) if tag else chunk.text)

        how = jobs.Follow(on_status=line.show, on_chunk=on_chunk,
                          logs=jobs.LogReader(backend.reg, job_id, attempt, rank) if logs else None,
                          compute=backend.compute, interval=interval, timeout=timeout)
        view = jobs.follow(backend.reg, job_id, goal, how)
    except KeyboardInterrupt:
        line.end()
        click.echo(f"stopped following {job_id}; the job goes on (`jobplane cancel {job_id}` stops it)", err=True)
        return jobs.EXIT_INTERRUPTED
    except jobs.WaitTimedOut as exc:
        line.end()
        click.echo(f"Error: {exc}", err=True)
        return jobs.EXIT_WAIT_TIMED_OUT
    line.end()
    click.echo(f"job {job_id} {view.state}" + (f": {view.reason}" if view.reason else ""), err=True)
    return jobs.exit_code(view.state)


class HyperparameterType(click.ParamType):  # type: ignore[type-arg]
    """NAME=VALUE, the value read as YAML like the spec's (10 an integer, 0.02 a number, adam a string)."""

    name = "name=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition("=")
        if not sep or not name.strip() or not text.strip():
            self.fail(f"{value!r} is not NAME=VALUE (e.g. --hp lr=0.02)", param, ctx)
        try:
            return name.strip(), yaml_input.load(text)
        except (yaml.YAMLError, ValueError):
            return name.strip(), text


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory to tar, upload and unpack as the job's working directory.")
@click.option("--id", "job_id", help="Job id (default: from the spec's name and the time).")
@click.option("--hp", "hps", multiple=True, type=HyperparameterType(),
              help="Set a hyperparameter, over the spec's (repeatable): --hp lr=0.02 --hp epochs=20.")
@click.option("--owner", envvar="JOBPLANE_OWNER",
              help="Submit as this owner: to queue/OWNER/ (env JOBPLANE_OWNER; default: the spec's owner).")
@click.option("-f", "--follow", is_flag=True, help="Then follow it as `logs -f` does and exit with its outcome.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between polls with -f.")
@registry_options
@cloud_errors
def submit(spec_file: Path, code_dir: Path | None, job_id: str | None, hps: tuple[tuple[str, Any], ...],
           owner: str | None, follow: bool, interval: float, **conn: str | None) -> None:
    """Submit a job: upload its code (with a progress bar), then drop the spec into queue/.

    \b
    Prints the job id. From then on the job is listed, described and followed as QUEUED until the
    launcher takes it (within seconds). With -f, follow it to the end as `logs -f` does, and exit 0
    SUCCEEDED, 1 FAILED, 3 CANCELLED, 4 TIMED_OUT, 5 STALLED, 6 INVALID, 130 Ctrl-C (never stops the job).
    With an owner (--owner, else the spec's), the spec goes to queue/OWNER/ and the code to code/OWNER/,
    the places the platform's IAM lets that team write; quotas count by it.
    Example:
      jobplane submit examples/demo.yaml --code examples/train -f
      jobplane submit examples/sagemaker.yaml --code examples/sagemaker --hp epochs=20 --hp lr=0.02
    """
    sub = jobs.plan_submission(spec_file, spec_file.read_text(), code_dir=code_dir, job_id=job_id,
                               hyperparameters=dict(hps), owner=owner)
    backend = connect(**conn)

    def bundled(files: int, uri: str) -> None:
        click.echo(f"code: {files} files from {sub.code_dir} -> {uri}", err=True)

    job_id = jobs.submit(backend, sub, on_bundle=bundled)
    click.echo(job_id)
    if follow:
        sys.exit(follow_job(backend, job_id, jobs.Goal.TERMINAL, interval=interval, logs=True))


@cli.command(name="ls")
@click.option("--all", "include_done", is_flag=True, help="Include finished jobs and rejected (INVALID) drops.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@registry_options
@cloud_errors
def ls_cmd(include_done: bool, as_json: bool, **conn: str | None) -> None:
    """List live jobs, queued ones included (or all with --all): state, attempt, nodes, type, spot, age,
    runtime, estimated cost, restarts, reason.

    \b
    A job still in queue/ shows as QUEUED, its age the time it has waited. The cost is an estimate (~):
    instance time at the price recorded at launch (`jobplane cost` sums it).
    Example:
      jobplane ls --all
    """
    rows = jobs.list_rows(connect(**conn).reg, include_done)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(box=None, header_style="bold")
    for col in COLUMNS:
        table.add_column(header(col), overflow="fold")
    for row in rows:
        table.add_row(*display(row))
    Console(width=max(160, shutil.get_terminal_size().columns)).print(table)


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (record, events, instances).")
@registry_options
@cloud_errors
def describe(job_id: str, as_json: bool, **conn: str | None) -> None:
    """Show a job: its record, event history and instances; a queued job's spec and time waited.

    \b
    Example:
      jobplane describe demo-1122-113005-ab12
    """
    backend = connect(**conn)
    view = jobs.find(backend.reg, job_id)
    record = view.record
    events = backend.reg.events(job_id) if record else []
    trained = metricview.series(jobs.read_metrics(backend.reg, job_id)) if record else []
    instances = [asdict(i) for i in backend.compute().list_managed()
                 if i.job_id == job_id] if record and record.instances else []
    now = utcnow()
    checkpoint = jobs.newest_checkpoint(backend.reg, job_id) if record else None
    if as_json:
        job = record.model_dump(mode="json", exclude={"last_event"}) if record else {  # "events" has it
            "id": view.id, "state": view.state, "since": view.since.isoformat(),
            "waited": (now - view.since).total_seconds(), "reason": view.reason, "drop": view.drop,
            "spec": spec_to_json(view.spec) if view.spec else None}
        spent = cost.as_json(cost.job_cost(record, now)) if record else None
        click.echo(json.dumps({"job": job, "events": events, "instances": instances, "cost": spent,
                                "metrics": [metricview.summary(s) for s in trained],
                                "checkpoint": asdict(checkpoint) if checkpoint else None}, indent=1, default=str))
        return
    console = Console()
    for col, cell in zip(COLUMNS, display(view_row(view, now)), strict=True):
        console.print(f"[bold]{col:>14}[/bold]  {cell}", highlight=False)
    if record is None:
        where = f"in {view.drop}, not yet taken by the launcher" if view.drop else "rejected, never recorded"
        console.print(f"[bold]{'status':>14}[/bold]  {jobview.status(view, now).text} ({where})", highlight=False)
        if view.spec:
            console.print(f"[bold]{'spec':>14}[/bold]", highlight=False)
            console.print(yaml.safe_dump(spec_to_json(view.spec), sort_keys=False).rstrip(), highlight=False)
        return
    console.print(f"[bold]{'instances':>14}[/bold]  {', '.join(record.instances) or '-'}")
    if record.spec.retry is not None and record.spec.retry.max:  # the errors retried, apart from the restarts
        console.print(f"[bold]{'retries':>14}[/bold]  {record.retries} of {record.spec.retry.max}", highlight=False)
    for used in record.usage:  # what each attempt ran on, and its estimated cost
        console.print(f"[bold]{'usage':>14}[/bold]  {cost.describe_attempt(used, now)} (estimated)", highlight=False)
    if checkpoint is not None or record.state == State.RUNNING:
        console.print(f"[bold]{'checkpoint':>14}[/bold]  {checkpoint.describe(now) if checkpoint else 'none yet'}",
                      highlight=False)
    for i, s in enumerate(trained):  # the last values; `jobplane metrics` has the rest
        console.print(f"[bold]{'metrics' if i == 0 else '':>14}[/bold]  {s.name} {metricview.last_line(s)}",
                      highlight=False)
    table = Table("TIME", "EVENT", "DETAIL", box=None, header_style="bold", title="events", title_justify="left")
    for ev in events:
        detail = {k: v for k, v in ev.items() if k not in ("time", "kind", "spec")}
        table.add_row(str(ev.get("time", ""))[:23], str(ev.get("kind", "")), json.dumps(detail, default=str))
    console.print(table)
    if instances:
        itable = Table("INSTANCE", "STATE", "RANK", "ATTEMPT", "TYPE", "ZONE", box=None, header_style="bold")
        for inst in instances:
            itable.add_row(*(str(inst[k]) for k in ("id", "state", "rank", "attempt", "instance_type", "zone")))
        console.print(itable)


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("-f", "--follow", is_flag=True,
              help="Wait for the job to start, print its output as it comes, exit with its outcome.")
@click.option("--rank", type=int, help="Only this node's output (default: every rank).")
@click.option("--attempt", type=int, help="Only this attempt (default: every attempt).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between polls with -f.")
@registry_options
@cloud_errors
def logs(job_id: str, follow: bool, rank: int | None, attempt: int | None, interval: float,
         **conn: str | None) -> None:
    """Print a job's output (uploaded by its agent in chunks), optionally following it.

    \b
    Lines are prefixed [attempt/rank] when the job has several nodes or attempts. With -f, a status line
    on stderr says where the job is (queued 3s, launching attempt 1, running on i-...) until it ends;
    then it exits 0 SUCCEEDED, 1 FAILED, 3 CANCELLED, 4 TIMED_OUT, 5 STALLED, 6 INVALID, or 130 on
    Ctrl-C (which stops following, never the job).
    Example:
      jobplane logs demo-1122-113005-ab12 -f
    """
    backend = connect(**conn)
    if follow:
        sys.exit(follow_job(backend, job_id, jobs.Goal.TERMINAL, interval=interval, logs=True, attempt=attempt,
                            rank=rank))
    view = jobs.find(backend.reg, job_id)
    chunks = jobs.LogReader(backend.reg, job_id, attempt, rank).new()
    for chunk in chunks:
        tag = (view.num_nodes > 1 and rank is None) or (attempt is None and view.attempt > 1)
        text = jobs.tagged(chunk) if tag else chunk.text
        click.echo(text, nl=not text.endswith("\n") and bool(text))
    if not chunks and not view.terminal:
        click.echo(f"job {job_id}: {jobview.status(view, utcnow()).text}; no output yet (-f waits for it)", err=True)


@cli.command(name="metrics")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, every point included.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a PNG line chart, one panel per metric (needs matplotlib: "
                   "pip install 'jobplane[plot]').")
@click.option("--rank", type=int, help="This node's metrics (default: each from the lowest rank that printed it).")
@click.option("--attempt", type=int, help="Only this attempt (default: every attempt).")
@registry_options
@cloud_errors
def metrics_cmd(job_id: str, as_json: bool, plot_file: Path | None, rank: int | None, attempt: int | None,
                **conn: str | None) -> None:
    """Show the training metrics a job's agents read from its output: last value, min, max, points, and
    the trend across attempts (| between attempts, ! a NaN or Inf).

    \b
    The metrics are the spec's `metrics` (SageMaker's MetricDefinitions), else loss, accuracy,
    learning_rate and step as the output prints them (`step 10 loss 0.5`, `loss=0.5`, `'loss': 0.5`).
    Example:
      jobplane metrics demo-1122-113005-ab12 --plot loss.png
    """
    backend = connect(**conn)
    view = jobs.find(backend.reg, job_id)
    trained = metricview.series(jobs.read_metrics(backend.reg, job_id, attempt, rank), rank)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "state": view.state,
                               "metrics": [metricview.summary(s, points=True) for s in trained]}, indent=1))
    elif trained:
        table = Table(*metricview.COLUMNS, box=None, header_style="bold")
        for s in trained:
            table.add_row(*metricview.cells(s))
        Console(width=max(120, shutil.get_terminal_size().columns)).print(table, highlight=False)
    else:
        click.echo(f"job {job_id} ({view.state}): no metrics yet" + (
            "" if view.terminal else "; they come with its log chunks"), err=True)
    if plot_file is not None:
        if not trained:
            raise UserError(f"no metrics to plot for {job_id}")
        from jobplane.plot import PlotUnavailable, plot

        try:
            drawn = plot(trained, plot_file, f"{job_id} ({view.state})")
        except PlotUnavailable as exc:
            raise UserError(str(exc)) from None
        click.echo(f"wrote {plot_file}: " + ", ".join(f"{name} {n} points" for name, n in drawn.items()), err=True)


class DurationType(click.ParamType):  # type: ignore[type-arg]
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--for", "goal", type=click.Choice([g.value for g in jobs.Goal]), default=jobs.Goal.TERMINAL.value,
              show_default=True, help="running: until it runs (or already ended); terminal: until it ends.")
@click.option("--timeout", type=DurationType(), help="Give up after this long (90s, 10m, 2h): exit 124.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between polls.")
@registry_options
@cloud_errors
def wait(job_id: str, goal: str, timeout: int | None, interval: float, **conn: str | None) -> None:
    """Wait until a job runs or ends, showing its status on stderr; for scripts and CI pipelines.

    \b
    Exit codes: 0 SUCCEEDED (or running, with --for running), 1 FAILED, 3 CANCELLED, 4 TIMED_OUT,
    5 STALLED, 6 INVALID, 124 --timeout passed first, 130 Ctrl-C (stops waiting, never the job).
    Example:
      jobplane wait demo-1122-113005-ab12 --for running --timeout 10m && jobplane logs demo-1122-113005-ab12 -f
    """
    sys.exit(follow_job(connect(**conn), job_id, jobs.Goal(goal), interval=interval, timeout=timeout))


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--force", is_flag=True,
              help="Also terminate the job's instances now, skipping the graceful stop and final sync.")
@registry_options
@cloud_errors
def cancel(job_id: str, force: bool, **conn: str | None) -> None:
    """Cancel a job: mark it CANCELLED and ask its agents to stop (they checkpoint, sync and power off).

    \b
    A job that has not started (queued, launching, waiting for capacity) never runs: any instance
    launched for it is terminated at once. A running job's instances that do not stop are terminated by
    the sweeper; --force terminates them at once.
    Example:
      jobplane cancel demo-1122-113005-ab12
    """
    backend = connect(**conn)
    done = jobs.cancel(backend.reg, job_id, force=force, compute=backend.compute)
    if done.terminated:
        click.echo(f"terminated {', '.join(done.terminated)}", err=True)
    click.echo(f"{job_id} CANCELLED" + (" before launch" if done.before_launch else ""))


@cli.command(name="cost")
@click.option("--since", type=DurationType(), help="Only instance time in this last stretch (24h, 7d); default: "
                                                   "all time.")
@click.option("--by", default="job", show_default=True,
              help="Group by job, owner, type (instance type), market (spot or on-demand, per attempt), label "
                   "(each key=value) or label:KEY.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@registry_options
@cloud_errors
def cost_cmd(since: int | None, by: str, as_json: bool, **conn: str | None) -> None:
    """Estimated cost of jobs' instance time, summed by job, owner, instance type, market or label.

    \b
    Each attempt's instances count from launch to the end of the attempt (at least a minute each), at the
    hourly price recorded at launch: EC2's Spot price history, else the policy's prices, else the price
    table jobplane ships. Disks, addresses, data transfer and storage are not included: an estimate.
    Examples:
      jobplane cost --since 7d --by owner
      jobplane cost --by label:team --json
    """
    if by not in cost.GROUPS and not by.startswith("label:"):
        raise click.BadParameter(f"{by!r}: use one of {', '.join(cost.GROUPS)} or label:KEY", param_hint="--by")
    now = utcnow()
    start = now - timedelta(seconds=since) if since else None
    rows = jobs.cost_rows(connect(**conn).reg, by, start, now)
    if as_json:
        click.echo(json.dumps([row.as_json(by) for row in rows], indent=1))
        return
    table = Table(box=None, header_style="bold", show_footer=bool(rows))
    total = sum((row.cost for row in rows), cost.Cost())
    for name, footer in ((by.upper(), "TOTAL" if by != "label" else ""), ("JOBS", ""),
                         ("INSTANCE HOURS", f"{total.instance_hours:.2f}" if by != "label" else ""),
                         ("EST. COST", cost.money(total) if by != "label" else "")):
        table.add_column(name, footer=footer)
    for row in rows:
        table.add_row(row.group, str(row.jobs), f"{row.cost.instance_hours:.2f}", cost.money(row.cost))
    Console().print(table)
    click.echo(f"estimated: instance time x hourly price{f' over the last {format_duration(since)}' if since else ''}"
               "; disks, addresses and transfer not included", err=True)


# ---- the local cloud -------------------------------------------------------------------------------------
state_dir_option = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                                help="Where the local cloud keeps its state (env JOBPLANE_LOCAL_STATE; "
                                     "default .jobplane).")


@cli.group()
def local() -> None:
    """Run the whole control plane on this machine: moto for AWS (or fakes of GCS and Compute Engine for
    GCP), local processes as VMs.

    \b
    Example:
      jobplane local up            # shell 1, until Ctrl-C (--cloud gcp: the GCP one)
      source .jobplane/env.sh      # shell 2
      jobplane submit examples/demo.yaml --code examples/train
    """


def control(state: Path | None, action: str, body: dict[str, Any]) -> Any:
    from jobplane.local.control import ControlError, call, state_dir

    try:
        return call(state_dir(state), action, body)
    except ControlError as exc:
        raise UserError(str(exc)) from None


@local.command()
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), default="aws", show_default=True,
              help="aws: moto, EC2 instances, Lambda handlers; gcp: the GCS and Compute Engine fakes, GCE VMs, Cloud "
                   "Functions through functions-framework.")
@click.option("--port", type=int, default=5055, show_default=True,
              help="Port of the cloud's API: moto's, or the GCS fake's (Compute Engine's: the next one); 0: any free.")
@click.option("--tick", type=float, default=1.0, show_default=True,
              help="Seconds between runner/trigger passes; scheduled functions run every max(tick, 2) s.")
@state_dir_option
def up(cloud: str, port: int, tick: float, state_dir: Path | None) -> None:
    """Start the local cloud in the foreground; print the exports a second shell needs. Ctrl-C stops it all.

    \b
    Example:
      jobplane local up --cloud gcp --port 5055 --tick 1
    """
    from jobplane.local.cloud import up as run_up
    from jobplane.local.control import state_dir as default_state_dir

    try:
        run_up(default_state_dir(state_dir), port, tick, cloud)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None


@local.command()
@click.argument("job_id", metavar="JOB")
@click.option("--rank", type=int, help="Only this rank's instance (default: every instance of the job).")
@click.option("--grace", type=float, default=10, show_default=True,
              help="Seconds between the Spot notice and the end of the VM (EC2 gives 120, GCE about 30).")
@state_dir_option
def preempt(job_id: str, rank: int | None, grace: float, state_dir: Path | None) -> None:
    """Reclaim a job's Spot VMs the way the cloud does: EC2's notice in IMDS and EventBridge, then termination;
    GCE's instance/preempted and its shutdown-script, then deletion.

    \b
    Example:
      jobplane local preempt demo-1122-113005-ab12 --grace 5
    """
    hit = control(state_dir, "preempt", {"job_id": job_id, "rank": rank, "grace": grace})
    if not hit:
        raise UserError(f"job {job_id} has no running instance" + (f" with rank {rank}" if rank is not None else ""))
    for item in hit:
        click.echo(f"{item['instance_id']} (rank {item['rank']}): notice {item['notice']}")


@local.command()
@click.argument("job_id", metavar="JOB")
@click.option("--rank", type=int, help="Only this rank's instance (default: every instance of the job).")
@state_dir_option
def kill(job_id: str, rank: int | None, state_dir: Path | None) -> None:
    """Kill a job's instance without warning, like a VM that dies: processes killed, instance terminated.

    \b
    Example:
      jobplane local kill two-node-1122-113005-ab12 --rank 1
    """
    hit = control(state_dir, "kill", {"job_id": job_id, "rank": rank})
    if not hit:
        raise UserError(f"job {job_id} has no running instance" + (f" with rank {rank}" if rank is not None else ""))
    click.echo(" ".join(hit))


@local.command()
@click.option("--unmanaged", is_flag=True, help="No jobplane:managed tag: jobplane must never touch it.")
@click.option("--job", "job_id", help="Tag it with this job id (default: none, an orphan).")
@click.option("--user-data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Script the instance runs (default: none, the VM idles).")
@state_dir_option
def instance(unmanaged: bool, job_id: str | None, user_data: Path | None, state_dir: Path | None) -> None:
    """Start an instance by hand (as a user would, outside jobplane); print its id.

    \b
    Example:
      jobplane local instance              # managed but no job: the sweeper should reap it
      jobplane local instance --unmanaged  # not ours: must survive every sweep
    """
    body = {"managed": not unmanaged, "job_id": job_id, "user_data": user_data.read_text() if user_data else ""}
    click.echo(control(state_dir, "instances", body)["instance_id"])


@local.command()
@click.argument("function")
@click.option("--resume", is_flag=True, help="Deliver its events and schedules again.")
@state_dir_option
def pause(function: str, resume: bool, state_dir: Path | None) -> None:
    """Stop a function from running, as if it failed every time: see what the rest and the cloud do without it.

    \b
    Nothing is delivered to it (its events are not kept for later); the scheduled runs catch up on resume.
    Example:
      jobplane local pause uptime_cap      # GCE's own maxRunDuration is then the only uptime cap
      jobplane local pause uptime_cap --resume
    """
    paused = control(state_dir, "pause", {"function": function, "paused": not resume})["paused"]
    click.echo(f"paused: {', '.join(paused) or 'none'}")


@local.command()
@state_dir_option
def status(state_dir: Path | None) -> None:
    """Show the running local cloud's instances and function invocations as JSON.

    \b
    Example:
      jobplane local status
    """
    click.echo(json.dumps(control(state_dir, "status", {}), indent=1))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
