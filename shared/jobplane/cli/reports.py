"""The commands that sum up jobs: the training metrics a job printed, and the estimated cost of instance time."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobplane.cli.connect import UserError, client, cloud_errors, registry_options
from jobplane.cli.params import DurationType
from jobplane.views import cost, metricview

if TYPE_CHECKING:  # annotations only: the CLI loads the decisions when a command runs
    from jobplane.sdk.client import Budget


def budget_lines(standings: list[Budget]) -> str:
    """Each budget as spent of limit with a bar and its warn line, the owners over it marked with what happens to
    their jobs."""
    width = max(len(b.owner) for b in standings)
    warn = sorted({b.warn_at for b in standings})
    head = f"budgets (calendar month, UTC; '|' warn line at {', '.join(f'{w}%' for w in warn)}):\n"
    return head + "".join(
        f"  {b.owner:<{width}}  {cost.bar(b.percent, b.warn_at)}  {b.figures}"
        f"{'  OVER BUDGET: ' + b.then if b.over else ('  WARNING: ' + b.then if b.level() != 'ok' else '')}\n"
        for b in standings)


@click.command(name="metrics")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, every point included.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a PNG line chart, one panel per metric (needs matplotlib: "
                   "pip install 'jobplane[plot]').")
@click.option("--rank", type=int, help="This node's metrics (default: each from the lowest rank that printed it).")
@click.option("--attempt", type=int, help="Only this attempt (default: every attempt).")
@click.option("--system", is_flag=True, help="The machine's figures the agents sampled instead (CPU, memory, disk, "
                                             "network, each GPU), every rank's.")
@registry_options
@cloud_errors
def metrics_cmd(job_id: str, as_json: bool, plot_file: Path | None, rank: int | None, attempt: int | None,
                system: bool, **conn: str | None) -> None:
    """Show the training metrics a job's agents read from its output: last value, min, max, points, and
    the trend across attempts (| between attempts, ! a NaN or Inf).

    \b
    The metrics are the spec's `metrics` (SageMaker's MetricDefinitions), else loss, accuracy,
    learning_rate and step as the output prints them (`step 10 loss 0.5`, `loss=0.5`, `'loss': 0.5`).
    With --system, the machine's figures every system_metrics_interval (15 s by default): cpu_percent,
    memory_used_gb, disk_used_gb, net_in_mb_s, net_out_mb_s and per GPU gpuN.utilization, .memory_used_gb,
    .power_w, .temperature_c, each rank's as its own row.
    Examples:
      jobplane metrics demo-1122-113005-ab12 --plot loss.png
      jobplane metrics demo-1122-113005-ab12 --system
    """
    job = client(**conn).get(job_id)
    view = job.view
    trained = [m.series for m in job.metrics(attempt=attempt, rank=rank, system=system).values()]
    what = "system metrics" if system else "metrics"
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "state": view.state,
                               what.replace(" ", "_"): [metricview.summary(s, points=True) for s in trained]},
                              indent=1))
    elif trained:
        table = Table(*metricview.COLUMNS, box=None, header_style="bold")
        for s in trained:
            table.add_row(*map(escape, metricview.cells(s)))  # "[rank 1]" is text, not rich markup
        Console(width=max(120, shutil.get_terminal_size().columns)).print(table, highlight=False)
    else:
        click.echo(f"job {job_id} ({view.state}): no {what} yet" + (
            "" if view.terminal else "; they come with its log chunks"), err=True)
    if plot_file is not None:
        if not trained:
            raise UserError(f"no metrics to plot for {job_id}")
        from jobplane.views.plot import PlotUnavailable, plot

        try:
            drawn = plot(trained, plot_file, f"{job_id} ({view.state})")
        except PlotUnavailable as exc:
            raise UserError(str(exc)) from None
        click.echo(f"wrote {plot_file}: " + ", ".join(f"{name} {n} points" for name, n in drawn.items()), err=True)


@click.command(name="cost")
@click.option("--since", type=DurationType(), help="Only instance time in this last stretch (24h, 7d); default: "
                                                   "all time.")
@click.option("--by", default="job", show_default=True,
              help="Group by job, owner, type (instance type), market (spot or on-demand, per attempt), label "
                   "(each key=value) or label:KEY.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.option("--gpu-idle", is_flag=True, help="Add the GPU-hours spent under 10% utilization, from each job's "
                                               "system metrics (reads them all: slower).")
@registry_options
@cloud_errors
def cost_cmd(since: int | None, by: str, as_json: bool, gpu_idle: bool, **conn: str | None) -> None:
    """Estimated cost of jobs' instance time, summed by job, owner, instance type, market or label.

    \b
    Each attempt's instances count from launch to the end of the attempt (at least a minute each), at the
    hourly price recorded at launch: EC2's Spot price history, else the policy's prices, else the price
    table jobplane ships. Disks, addresses, data transfer and storage are not included: an estimate.
    Examples:
      jobplane cost --since 7d --by owner
      jobplane cost --by label:team --json
      jobplane cost --by owner --gpu-idle
    """
    from jobplane.model.bounds import format_duration  # with the spec's field types: loaded when a command runs

    if by not in cost.GROUPS and not by.startswith("label:"):
        raise click.BadParameter(f"{by!r}: use one of {', '.join(cost.GROUPS)} or label:KEY", param_hint="--by")
    now = datetime.now(UTC)
    start = now - timedelta(seconds=since) if since else None
    jobplane = client(**conn)
    rows = jobplane.cost(by=by, since=start, now=now)
    idle = jobplane.gpu_idle_hours(by=by, since=start) if gpu_idle else None
    budgets = {b.owner: b for b in jobplane.budgets(now=now)}
    if as_json:
        click.echo(json.dumps([row.as_json(by) | ({"gpu_idle_hours": round(idle.get(row.group, 0.0), 3)}
                                                  if idle is not None else {})
                               | (budgets[row.group].as_json() if by == "owner" and row.group in budgets else {})
                               for row in rows], indent=1))
        return
    table = Table(box=None, header_style="bold", show_footer=bool(rows))
    total = sum((row.cost for row in rows), cost.Cost())
    for name, footer in ((by.upper(), "TOTAL" if by != "label" else ""), ("JOBS", ""),
                         ("INSTANCE HOURS", f"{total.instance_hours:.2f}" if by != "label" else ""),
                         ("EST. COST", cost.money(total) if by != "label" else "")):
        table.add_column(name, footer=footer)
    if idle is not None:
        table.add_column("GPU-H <10%", footer=f"{sum(idle.values()):.2f}" if by != "label" else "")
    for row in rows:
        idle_cell = [f"{idle.get(row.group, 0.0):.2f}"] if idle is not None else []
        table.add_row(row.group, str(row.jobs), f"{row.cost.instance_hours:.2f}", cost.money(row.cost), *idle_cell)
    Console().print(table)
    if budgets:
        click.echo(budget_lines(list(budgets.values())), nl=False)
    click.echo(f"estimated: instance time x hourly price{f' over the last {format_duration(since)}' if since else ''}"
               "; disks, addresses and transfer not included", err=True)
