"""The commands of a job's life: submit, ls, describe, logs, wait and cancel."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from jobplane.cli.connect import UserError, client, cloud_errors, registry_options
from jobplane.cli.follow import follow_job, tagged
from jobplane.cli.params import DurationType, HyperparameterType
from jobplane.cli.sweeps import describe_array, grouped
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.views import cost, jobview, metricview
from jobplane.views.events import event_line, launched_attempts
from jobplane.views.jobview import COLUMNS, display, header, view_row

GOALS = ("running", "terminal")  # wait --for



@click.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory to tar, upload and unpack as the job's working directory.")
@click.option("--id", "job_id", help="Job id (default: from the spec's name and the time).")
@click.option("--hp", "hps", multiple=True, type=HyperparameterType(),
              help="Set a hyperparameter, over the spec's (repeatable): --hp lr=0.02 --hp epochs=20.")
@click.option("--owner", envvar="JOBPLANE_OWNER",
              help="Submit as this owner: to queue/OWNER/ (env JOBPLANE_OWNER; default: the spec's owner). A spec "
                   "that names another owner is refused: neither wins, the two must agree.")
@click.option("-p", "--priority", metavar="CLASS",
              help="A priority class of the policy's (`jobplane policy` lists them), over the spec's `priority:`.")
@click.option("-f", "--follow", is_flag=True, help="Then follow it as `logs -f` does and exit with its outcome.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between polls with -f.")
@registry_options
@cloud_errors
def submit(spec_file: Path, code_dir: Path | None, job_id: str | None, hps: tuple[tuple[str, Any], ...],
           owner: str | None, priority: str | None, follow: bool, interval: float, **conn: str | None) -> None:
    """Submit a job: check it against the policy in force, upload its code (with a progress bar), then drop
    the spec into queue/.

    \b
    Prints the job id. A spec the launcher would refuse by the policy in force (an instance type, a priority
    class unknown or not the owner's, an array that can never fit the quotas), an `after:` naming no job or
    array, or an owner at its budget when the policy refuses new jobs past it, is refused at once, naming
    the field: exit 1, nothing uploaded or dropped. From then on the job is listed, described and followed as
    QUEUED until the launcher takes it (within seconds). With -f, follow it to the end as `logs -f` does, and
    exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED, 4 TIMED_OUT, 5 STALLED, 6 INVALID, 130 Ctrl-C (never stops the job).
    With an owner (--owner or the spec's; if both, they must agree), the spec goes to queue/OWNER/ and the
    code to code/OWNER/, the places the platform's IAM lets that team write; quotas count by it.
    Example:
      jobplane submit examples/demo.yaml --code examples/train -f
      jobplane submit examples/sagemaker.yaml --code examples/sagemaker --hp epochs=20 --hp lr=0.02 -p urgent
    """
    from jobplane import sdk  # loaded by a command that runs, not by --help

    prepared = sdk.prepare(spec_file, code=code_dir, id=job_id, hyperparameters=dict(hps), owner=owner,
                           priority=priority)
    registry = client(**conn)

    def bundled(files: int, uri: str) -> None:
        click.echo(f"code: {files} files from {prepared.code_dir} -> {uri}", err=True)

    if follow and prepared.doc.get("sweep") is not None:
        raise UserError("-f follows a job; a sweep's trials are jobs: follow it with `jobplane sweep describe ID`")
    if follow and prepared.doc.get("array") is not None:
        raise UserError("-f follows a job; an array's members are jobs: follow one with `jobplane logs ID-0 -f`")
    job = registry.submit(prepared, on_code=bundled)
    click.echo(job.id)
    if prepared.doc.get("sweep") is not None:
        click.echo(f"a sweep: its trials are {job.id}-t001, ... (jobplane sweep describe {job.id})", err=True)
    elif prepared.doc.get("array") is not None:
        click.echo(f"an array: its members are {job.id}-0, {job.id}-1, ... (jobplane ls; jobplane cancel {job.id} "
                   "cancels them all)", err=True)
    if follow:
        sys.exit(follow_job(registry, job.id, "terminal", interval=interval, logs=True))


@click.command(name="ls")
@click.option("--all", "include_done", is_flag=True, help="Include finished jobs and rejected (INVALID) drops.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--trials", is_flag=True, help="List each trial of a sweep and each member of an array (default: one "
                                            "line per sweep or array).")
@registry_options
@cloud_errors
def ls_cmd(include_done: bool, as_json: bool, trials: bool, **conn: str | None) -> None:
    """List live jobs, queued ones included (or all with --all): state, attempt, nodes, type, spot, age,
    runtime, estimated cost, restarts, reason.

    \b
    A job still in queue/ shows as QUEUED, its age the time it has waited. The cost is an estimate (~):
    instance time at the price recorded at launch (`jobplane cost` sums it). The trials of a sweep show
    as one SWEEP line (their count by state, nodes and cost summed), the members of an array as one line
    (ARRAY while it runs, then COMPLETED, FAILED or CANCELLED; its size and its members by state, those not
    dropped yet too), unless --trials.
    Example:
      jobplane ls --all
    """
    registry, now = client(**conn), utcnow()
    listed = [(None if trials or job.view.spec is None else job.view.spec.belongs_to, view_row(job.view, now))
              for job in registry.list(include_finished=include_done)]
    arrays = {} if trials else {a.id: a.record for a in registry.arrays(include_finished=include_done)}
    rows = sorted(grouped(listed, arrays, everything=include_done, now=now), key=lambda r: r["age"], reverse=True)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    width = terminal_width()
    table = Table(box=None, header_style="bold")
    for col in COLUMNS:
        table.add_column(header(col), no_wrap=True)
    for cells in one_line_each([display(row) for row in rows], width):
        table.add_row(*cells)
    Console(width=max(width, 80)).print(table)
    if not rows and not include_done:
        click.echo(f"no live {'jobs or trials' if trials else 'jobs'}: --all lists the ended ones too", err=True)


def terminal_width() -> int:
    """A terminal's width, else (piped, a file) 160 columns: `ls` keeps one line a job either way."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else 160


def one_line_each(rows: list[list[str]], width: int, least: int = 24) -> list[list[str]]:
    """The rows with their last cell (the reason) cut short so that each fits one line of `width` characters
    (at least `least` of the reason shown); `describe` has the reason whole."""
    if not rows:
        return rows
    widths = [max(len(header(col)), *(len(r[i]) for r in rows)) + 2 for i, col in enumerate(COLUMNS[:-1])]
    room = max(least, width - sum(widths) - 2)
    return [[*r[:-1], r[-1] if len(r[-1]) <= room else r[-1][:room - 1] + "…"] for r in rows]


@click.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (record, events, instances).")
@registry_options
@cloud_errors
def describe(job_id: str, as_json: bool, **conn: str | None) -> None:
    """Show a job: its record, event history and instances; a queued job's spec and time waited. An array's
    id: its state, size, members by state (those not dropped yet too), cost and each member.

    \b
    Example:
      jobplane describe demo-1122-113005-ab12
    """
    from jobplane import sdk  # loaded by a command that runs, not by --help
    from jobplane.model.bounds import format_duration  # with the spec's field types: loaded when a command runs
    from jobplane.model.spec import spec_to_json  # loaded when a command runs, not for --help

    registry = client(**conn)
    try:
        job = registry.get(job_id)
    except sdk.JobNotFound as missing:
        try:
            describe_array(registry.array(job_id), as_json)
        except sdk.SweepNotFound:
            try:
                registry.sweep(job_id)
            except sdk.SweepNotFound:
                raise missing from None
            raise UserError(f"{job_id} is a sweep: jobplane sweep describe {job_id}") from None
        return
    view = job.view
    record = view.record
    events = job.events() if record else []
    trained = [m.series for m in job.metrics().values()] if record else []
    instances = [asdict(i) for i in job.instances()] if record and record.instances else []
    now = utcnow()
    checkpoint = job.checkpoint() if record else None
    life = job.lifetime() if record else None
    sizing = job.right_sizing() if record else None
    if as_json:
        shown = record.model_dump(mode="json", exclude={"last_event"}) if record else {  # "events" has it
            "id": view.id, "state": view.state, "since": view.since.isoformat(),
            "waited": (now - view.since).total_seconds(), "reason": view.reason, "drop": view.drop,
            "spec": spec_to_json(view.spec) if view.spec else None}
        spent = cost.as_json(cost.job_cost(record, now)) if record else None
        click.echo(json.dumps({"job": shown, "events": events, "instances": instances, "cost": spent,
                                "metrics": [metricview.summary(s) for s in trained],
                                "checkpoint": asdict(checkpoint) if checkpoint else None,
                                "lifetime": asdict(life) if life else None, "right_sizing": sizing},
                               indent=1, default=str))
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
    if record.spec.priority:  # by its class's name, as the spec and the policy name it
        console.print(f"[bold]{'priority':>14}[/bold]  {record.spec.priority}", highlight=False)
    if record.state == State.WAITING_CAPACITY:  # where it stands among the waiting, as `jobplane queue` says
        for place in registry.queue(owner=record.owner):
            if place.job_id == record.id:
                at = f"position {place.position} of owner {place.owner}'s line; " if place.position else ""
                console.print(f"[bold]{'queue':>14}[/bold]  {at}{place.why}", highlight=False)
    if (hold := jobview.held(record, now)) is not None:  # a FAILED attempt's VMs kept for a look
        console.print(f"[bold]{'debug hold':>14}[/bold]  {hold}", highlight=False)
    if record.spec.retry is not None and record.spec.retry.max:  # the errors retried, apart from the restarts
        console.print(f"[bold]{'retries':>14}[/bold]  {record.retries} of {record.spec.retry.max}", highlight=False)
    launched = launched_attempts(record.usage, events)
    if record.state == State.LAUNCHING:  # the attempt being launched counts, as the VMs are on their way
        launched.add(record.attempt)
    if life is not None and launched:  # the policy's bounds on the job's whole life: attempts that got VMs
        console.print(f"[bold]{'attempts':>14}[/bold]  {len(launched)} of at most {life.max_attempts} "
                      f"(policy max_attempts_per_job {life.max_attempts_per_job})", highlight=False)
    if life is not None and not record.terminal:  # deadlines that no longer apply once it ended
        console.print(f"[bold]{'last start':>14}[/bold]  {life.last_start:%Y-%m-%d %H:%M} UTC (max_wait "
                      f"{format_duration(life.max_wait)})", highlight=False)
        console.print(f"[bold]{'ends by':>14}[/bold]  {life.ends_by:%Y-%m-%d %H:%M} UTC (each attempt at most "
                      f"{format_duration(life.max_runtime)})", highlight=False)
    for used in record.usage:  # what each attempt ran on, and its estimated cost
        console.print(f"[bold]{'usage':>14}[/bold]  {cost.describe_attempt(used, now)} (estimated)", highlight=False)
    if checkpoint is not None or record.state == State.RUNNING:
        console.print(f"[bold]{'checkpoint':>14}[/bold]  {checkpoint.describe(now) if checkpoint else 'none yet'}",
                      highlight=False)
    for i, s in enumerate(trained):  # the last values; `jobplane metrics` has the rest
        console.print(f"[bold]{'metrics' if i == 0 else '':>14}[/bold]  {s.name} {metricview.last_line(s)}",
                      highlight=False)
    if sizing is not None:  # an ended job's GPUs were more than it needed
        console.print(f"[bold]{'right-sizing':>14}[/bold]  {sizing}", highlight=False)
    console.print("[bold]events[/bold] (UTC)")
    for ev in events:  # one line each, never folded: `describe --json` has every field
        when, kind, what = event_line(ev, launched)
        click.echo(f"  {when}  {kind:<18} {what}")
    if instances:
        itable = Table("INSTANCE", "STATE", "RANK", "ATTEMPT", "TYPE", "ZONE", box=None, header_style="bold")
        for inst in instances:
            itable.add_row(*(str(inst[k]) for k in ("id", "state", "rank", "attempt", "instance_type", "zone")))
        console.print(itable)


@click.command()
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
    registry = client(**conn)
    if follow:
        sys.exit(follow_job(registry, job_id, "terminal", interval=interval, logs=True, attempt=attempt, rank=rank))
    job = registry.get(job_id)
    view = job.view
    tag = (view.num_nodes > 1 and rank is None) or (attempt is None and view.attempt > 1)
    printed = False
    for line in job.logs(attempt=attempt, rank=rank):
        click.echo(tagged(line) if tag else line + "\n", nl=False)
        printed = True
    if not printed and not view.terminal:
        click.echo(f"job {job_id}: {jobview.status(view, utcnow()).text}; no output yet (-f waits for it)", err=True)


@click.command()
@click.argument("job_id", metavar="ID")
@click.option("--for", "goal", type=click.Choice(GOALS), default="terminal",
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
    sys.exit(follow_job(client(**conn), job_id, goal, interval=interval, timeout=timeout))


@click.command()
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
    the next check; --force terminates them at once. A team member cancels its own team's jobs only: the
    control plane does it for them (the command waits up to a minute for it).
    An array's id cancels each of its members that has not ended, and the array: it drops no more.
    Example:
      jobplane cancel demo-1122-113005-ab12
    """
    from jobplane import sdk  # loaded by a command that runs, not by --help

    registry = client(**conn)
    try:
        job = registry.get(job_id)
    except sdk.JobNotFound as missing:
        try:
            array = registry.array(job_id)
        except sdk.SweepNotFound:
            raise missing from None
        done_array = array.cancel(force=force)
        if done_array.record.live:  # a team member's request the functions have not come to yet
            click.echo(f"{job_id}: cancel requested; the control plane stops the array at its next pass")
            return
        click.echo(f"{job_id} {done_array.record.state} (an array: its {len(done_array.record.trials)} members "
                   "dropped so far, each not ended cancelled)")
        return
    done = job.cancel(force=force)
    if done.terminated:
        click.echo(f"terminated {', '.join(done.terminated)}", err=True)
    state = done.record.state
    if not done.record.terminal:  # a team member's request the functions have not come to yet
        click.echo(f"{job_id}: cancel requested; the control plane stops it at its next pass (now {state})")
    else:
        click.echo(f"{job_id} {state}" + (" before launch" if state == State.CANCELLED and done.before_launch else ""))
