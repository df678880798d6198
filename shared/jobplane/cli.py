"""`jobplane ...`: the command line for ML engineers and platform teams."""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import click
import yaml
from rich.console import Console
from rich.table import Table

from jobplane import keys
from jobplane.errors import FieldError, SpecError
from jobplane.jobview import COLUMNS, display, job_row, readable_job_id, rejected_row
from jobplane.policy import DEFAULT_POLICY, Policy, check_against_policy, parse_policy
from jobplane.registry import JobExists, JobNotFound, Registry, TransitionRefused, utcnow
from jobplane.settings import Settings
from jobplane.spec import json_schema_text, load_document, parse_spec
from jobplane.states import LIVE, State


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobplane")
def cli() -> None:
    """jobplane: run ML training jobs on plain cloud VMs from specs dropped in a bucket.

    \b
    \b
    Quick start (no cloud account needed):
      jobplane local up                                   # shell 1: the local cloud
      jobplane submit examples/demo.yaml --code examples/train
      jobplane ls && jobplane logs ID -f
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
    """--bucket / --endpoint / --region, each defaulting to the environment a `local up` prints."""
    func = click.option("--region", envvar="AWS_REGION", help="Cloud region (env AWS_REGION).")(func)
    func = click.option("--endpoint", envvar="AWS_ENDPOINT_URL",
                        help="S3/EC2 endpoint URL, e.g. the local cloud's (env AWS_ENDPOINT_URL).")(func)
    func = click.option("--bucket", envvar="JOBPLANE_BUCKET", help="Registry bucket (env JOBPLANE_BUCKET).")(func)
    return func


@dataclass
class Ctx:
    reg: Registry
    bucket: str
    root: str

    def compute(self) -> Any:
        from jobplane.clouds.aws import Ec2Compute

        return Ec2Compute()


def connect(bucket: str | None, endpoint: str | None, region: str | None) -> Ctx:
    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    if region:
        os.environ["AWS_REGION"] = os.environ.get("AWS_DEFAULT_REGION") or region
        os.environ.setdefault("AWS_DEFAULT_REGION", region)
    try:
        settings = Settings.from_env(bucket)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    from jobplane.clouds.s3 import S3Store

    return Ctx(Registry(S3Store(settings.bucket), settings.root), settings.bucket, settings.root)


def cloud_errors(func: F) -> F:
    """Turn the errors a user can cause or meet (no bucket, no credentials, unknown job) into one line."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except (JobNotFound, JobExists, TransitionRefused) as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # botocore errors without importing botocore here
            name = type(exc).__name__
            if name in ("NoCredentialsError", "EndpointConnectionError", "ClientError", "NoSuchBucket",
                        "ParamValidationError", "ConnectionClosedError", "NoRegionError"):
                raise UserError(f"{name}: {exc}") from None
            raise
    return cast(F, wrapper)


def make_bundle(directory: Path, out: Path) -> int:
    """tar.gz of directory's contents (caches and VCS left out); returns the file count."""
    skip = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
    count = 0

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal count
        parts = Path(info.name).parts
        if any(p in skip for p in parts) or info.name.endswith(".pyc"):
            return None
        count += info.isfile()
        return info

    with tarfile.open(out, "w:gz") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return count


def upload_bundle(ctx: Ctx, key: str, path: Path) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from jobplane.clouds.s3_transfer import upload_file

    with Progress(TextColumn("uploading code"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("code", total=path.stat().st_size)
        upload_file(ctx.reg.store, ctx.reg.key(key), path,  # type: ignore[arg-type]
                    lambda sent: progress.advance(task, sent))


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory to tar, upload and unpack as the job's working directory.")
@click.option("--id", "job_id", help="Job id (default: from the spec's name and the time).")
@registry_options
@cloud_errors
def submit(spec_file: Path, code_dir: Path | None, job_id: str | None, **conn: str | None) -> None:
    """Submit a job: upload its code (with a progress bar), then drop the spec into queue/.

    \b
    Prints the job id. The launcher picks the spec up from queue/ within seconds.
    Example:
      jobplane submit examples/demo.yaml --code examples/train
    """
    text = spec_file.read_text()
    doc = load_document(text, spec_file.name)
    if code_dir is None and isinstance(doc.get("code"), str) and "://" not in doc["code"]:
        code_dir = (spec_file.parent / doc["code"]).resolve()  # `code: ./src` in the spec means the same
        if not code_dir.is_dir():
            raise UserError(f"{spec_file}: code: {doc['code']!r} is not a directory")
    if code_dir is not None:
        doc["code"] = "s3://placeholder/code.tar.gz"  # validated now, set to the real URI below
    job_id = job_id or doc.get("id") or readable_job_id(str(doc.get("name") or spec_file.stem), utcnow(),
                                                        secrets.token_hex(2))
    if doc.get("id") not in (None, job_id):
        raise UserError(f"--id {job_id!r} differs from the spec's id {doc['id']!r}")
    try:
        parse_spec(yaml.safe_dump(doc), job_id=job_id, source=spec_file.name)
    except SpecError as exc:
        raise UserError(f"{spec_file}: " + "; ".join(str(e) for e in exc.errors)) from None
    ctx = connect(**conn)
    if ctx.reg.exists(job_id):
        raise JobExists(job_id)
    if code_dir is not None:
        with tempfile.TemporaryDirectory() as tmp:
            bundle = Path(tmp) / "code.tar.gz"
            files = make_bundle(code_dir, bundle)
            upload_bundle(ctx, keys.code_bundle(job_id), bundle)
        doc["code"] = f"s3://{ctx.bucket}/{ctx.reg.key(keys.code_bundle(job_id))}"
        click.echo(f"code: {files} files from {code_dir} -> {doc['code']}", err=True)
    doc["id"] = job_id
    from jobplane.clouds.base import PreconditionFailed

    try:
        ctx.reg.store.put_if_absent(ctx.reg.key(keys.queue_entry(job_id)), yaml.safe_dump(doc, sort_keys=False)
                                    .encode(), "application/yaml")
    except PreconditionFailed:
        raise UserError(f"job {job_id!r} is already queued") from None
    click.echo(job_id)


def load_rows(reg: Registry, include_done: bool) -> list[dict[str, Any]]:
    now = utcnow()
    if include_done:
        ids = sorted({k.split("/")[1] for k, _, _ in reg.listing(keys.JOBS) if k.endswith("/job.json")})
    else:
        ids = sorted(reg.active())
    rows = []
    for job_id in ids:
        try:
            rows.append(job_row(reg.job(job_id), now))
        except JobNotFound:
            continue  # finished between the listing and the read
    if include_done:
        for key, modified, _ in reg.listing(keys.REJECTED):
            job_id = key.removeprefix(keys.REJECTED).removesuffix(".error.json")
            if key.endswith(".error.json") and job_id not in ids:  # a recorded INVALID job shows once
                rows.append(rejected_row(job_id, reg.get_json(key), modified, now))
    return sorted(rows, key=lambda r: r["age"], reverse=True)


@cli.command(name="ls")
@click.option("--all", "include_done", is_flag=True, help="Include finished jobs and rejected (INVALID) drops.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@registry_options
@cloud_errors
def ls_cmd(include_done: bool, as_json: bool, **conn: str | None) -> None:
    """List live jobs (or all with --all): state, attempt, nodes, type, spot, age, runtime, restarts, reason.

    \b
    Example:
      jobplane ls --all
    """
    rows = load_rows(connect(**conn).reg, include_done)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(box=None, header_style="bold")
    for col in COLUMNS:
        table.add_column(col.upper().replace("_", " "), overflow="fold")
    for row in rows:
        table.add_row(*display(row))
    Console(width=max(160, shutil.get_terminal_size().columns)).print(table)


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (record, events, instances).")
@registry_options
@cloud_errors
def describe(job_id: str, as_json: bool, **conn: str | None) -> None:
    """Show a job: its record, event history and instances.

    \b
    Example:
      jobplane describe demo-1122-113005-ab12
    """
    ctx = connect(**conn)
    record = ctx.reg.job(job_id)
    events = ctx.reg.events(job_id)
    instances = [asdict(i) for i in ctx.compute().list_managed() if i.job_id == job_id] if record.instances else []
    if as_json:
        body = {"job": record.model_dump(mode="json"), "events": events, "instances": instances}
        click.echo(json.dumps(body, indent=1, default=str))
        return
    console = Console()
    row = job_row(record, utcnow())
    for col, cell in zip(COLUMNS, display(row), strict=True):
        console.print(f"[bold]{col:>14}[/bold]  {cell}")
    console.print(f"[bold]{'instances':>14}[/bold]  {', '.join(record.instances) or '-'}")
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


def print_new_chunks(reg: Registry, job_id: str, attempt: int | None, rank: int | None, seen: set[str],
                     tag_ranks: bool) -> tuple[int, set[int]]:
    """Print log chunks not seen yet in key order; return (count, attempts seen)."""
    new = 0
    attempts: set[int] = set()
    for key, _, _ in reg.listing(keys.logs_prefix(job_id, attempt, rank if attempt is not None else None)):
        parts = key.removeprefix(keys.logs_prefix(job_id)).split("/")
        if len(parts) != 3 or key in seen or (rank is not None and parts[1] != str(rank)):
            continue
        seen.add(key)
        new += 1
        attempts.add(int(parts[0]))
        text = reg.get_bytes(key).decode(errors="replace")
        if tag_ranks:
            text = "".join(f"[{parts[0]}/{parts[1]}] {line}" for line in text.splitlines(keepends=True))
        click.echo(text, nl=not text.endswith("\n") and bool(text))
    return new, attempts


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job finishes.")
@click.option("--rank", type=int, help="Only this node's output (default: every rank).")
@click.option("--attempt", type=int, help="Only this attempt (default: every attempt).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between polls with -f.")
@registry_options
@cloud_errors
def logs(job_id: str, follow: bool, rank: int | None, attempt: int | None, interval: float,
         **conn: str | None) -> None:
    """Print a job's output (uploaded by its agent in chunks), optionally following it.

    \b
    Lines are prefixed [attempt/rank] when the job has several nodes or attempts.
    Example:
      jobplane logs demo-1122-113005-ab12 -f
    """
    reg = connect(**conn).reg
    record = reg.job(job_id)
    seen: set[str] = set()
    tag = (record.spec.num_nodes > 1 and rank is None) or (record.attempt > 1 and attempt is None)
    print_new_chunks(reg, job_id, attempt, rank, seen, tag)
    while follow and not record.terminal:
        time.sleep(interval)
        record = reg.job(job_id)
        tag = tag or (record.attempt > 1 and attempt is None)
        print_new_chunks(reg, job_id, attempt, rank, seen, tag)
    if follow:
        time.sleep(interval)  # the agent's last chunk lands before its exit report: one more look
        print_new_chunks(reg, job_id, attempt, rank, seen, tag)
        click.echo(f"job {job_id} {record.state}" + (f": {record.reason}" if record.reason else ""), err=True)


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--force", is_flag=True,
              help="Also terminate the job's instances now, skipping the graceful stop and final sync.")
@registry_options
@cloud_errors
def cancel(job_id: str, force: bool, **conn: str | None) -> None:
    """Cancel a job: mark it CANCELLED and ask its agents to stop (they checkpoint, sync and power off).

    \b
    Instances that do not stop are terminated by the sweeper; --force terminates them at once.
    Example:
      jobplane cancel demo-1122-113005-ab12
    """
    ctx = connect(**conn)
    record = ctx.reg.job(job_id)
    if record.terminal:
        raise UserError(f"job {job_id} is already {record.state}")
    ctx.reg.put_json(keys.stop_request(job_id), {"time": utcnow().isoformat(), "by": "cli", "reason": "cancel"})
    record = ctx.reg.transition(job_id, State.CANCELLED, reason="cancelled by the user", expect=LIVE)
    if force and record.instances:
        compute = ctx.compute()
        mine = [i.id for i in compute.list_managed() if i.job_id == job_id and not i.protected]
        if mine:
            compute.terminate(mine)
            click.echo(f"terminated {', '.join(mine)}", err=True)
    click.echo(f"{job_id} CANCELLED")


# ---- the local cloud -------------------------------------------------------------------------------------
state_dir_option = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                                help="Where the local cloud keeps its state (env JOBPLANE_LOCAL_STATE; "
                                     "default .jobplane).")


@cli.group()
def local() -> None:
    """Run the whole control plane on this machine: moto for AWS, local processes as VMs.

    \b
    Example:
      jobplane local up            # shell 1, until Ctrl-C
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
@click.option("--port", type=int, default=5055, show_default=True, help="moto server port (0: any free port).")
@click.option("--tick", type=float, default=1.0, show_default=True,
              help="Seconds between runner/trigger passes; scheduled functions run every max(tick, 2) s.")
@state_dir_option
def up(port: int, tick: float, state_dir: Path | None) -> None:
    """Start the local cloud in the foreground; print the exports a second shell needs. Ctrl-C stops it all.

    \b
    Example:
      jobplane local up --port 5055 --tick 1
    """
    from jobplane.local.cloud import up as run_up
    from jobplane.local.control import state_dir as default_state_dir

    try:
        run_up(default_state_dir(state_dir), port, tick)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None


@local.command()
@click.argument("job_id", metavar="JOB")
@click.option("--rank", type=int, help="Only this rank's instance (default: every instance of the job).")
@click.option("--grace", type=float, default=10, show_default=True,
              help="Seconds between the Spot notice and the termination (EC2 gives 120).")
@state_dir_option
def preempt(job_id: str, rank: int | None, grace: float, state_dir: Path | None) -> None:
    """Reclaim a job's Spot instances the way EC2 does: a notice in IMDS and EventBridge, then termination.

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
