"""`jobplane queue` (who uses what of the quotas, then where the waiting jobs stand) and `jobplane policy` (the
policy in force): what the admission decides on, as it counts it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobplane.cli.connect import client, cloud_errors, registry_options
from jobplane.model.clock import utcnow
from jobplane.views.jobview import human_duration

if TYPE_CHECKING:
    from jobplane.model.policy import Policy
    from jobplane.sdk.client import Budget

# The policy's durations (seconds in the policy's dataclass), shown as 30m, 24h, 7d.
DURATIONS = {"default_max_runtime", "max_runtime_ceiling", "default_max_wait", "max_wait_ceiling",
             "default_stall_timeout", "default_boot_timeout", "safety.orphan_grace", "safety.stop_grace",
             "idle_gpu.window"}


def _console() -> Console:
    return Console(width=max(160, shutil.get_terminal_size().columns))


def _nodes(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


@click.command(name="queue")
@click.option("--owner", help="Only this owner's usage and waiting jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {usage: {owners, deployment, families}, jobs}.")
@registry_options
@cloud_errors
def queue_cmd(owner: str | None, as_json: bool, **conn: str | None) -> None:
    """Who uses what of the quotas, then the waiting jobs where they stand.

    \b
    First each owner's nodes in use of its quota, its jobs waiting in line, its weight and fair share of the
    deployment's cap (when the policy sets one), its spend this month against its budget; then the
    deployment's cap and each instance family's cap. Then each owner's line in the order it is admitted
    (a higher priority class first, then the earliest submitted), with each job's position and why it waits,
    the jobs waiting for their `after:`, and each array's members not dropped yet.
    Example:
      jobplane queue --owner team-a
    """
    registry = client(**conn)
    found, used = registry.queue(owner=owner), registry.usage(owner=owner)
    if as_json:
        click.echo(json.dumps({"usage": used.as_dict(), "jobs": [place.as_dict() for place in found]}, indent=1))
        return
    console = _console()
    usage = Table("OWNER", "NODES IN USE", "WAITING", "WEIGHT", "FAIR SHARE", "BUDGET THIS MONTH", box=None,
                  header_style="bold", title="usage", title_justify="left")
    for row in used.owners:
        cap = used.deployment.limit if used.deployment else None
        usage.add_row(row.owner, f"{row.in_use} of {row.quota}", str(row.waiting), f"{row.weight:g}",
                      f"{_nodes(row.share)} of {cap}" if row.share is not None else "-",
                      _budget(row.budget))
    if used.owners:
        console.print(usage)
    else:
        console.print("[bold]usage[/bold]: no owner holds or waits for nodes" + (f" ({owner})" if owner else ""),
                      highlight=False)
    console.print(f"deployment cap: {used.deployment}" if used.deployment else
                  "deployment cap: none (max_active_instances unset)", highlight=False)
    for family in used.families:
        console.print(f"family {family.name}: {family}", highlight=False)
    table = Table("POSITION", "ID", "OWNER", "PRIORITY", "NODES", "WAITING", "WHY", box=None, header_style="bold",
                  title="waiting", title_justify="left")
    now = utcnow()
    for place in found:
        waited = human_duration((now - place.since).total_seconds()) if place.since else "-"
        table.add_row(str(place.position or "-"), place.job_id, place.owner, place.priority_name, str(place.nodes),
                      waited, place.why)
    console.print(table)
    if not found:
        click.echo("no job waits" + (f" for owner {owner}" if owner else ""), err=True)


def _budget(standing: Budget | None) -> str:
    """The owner's spend of its budget; an owner over it marked, with what happens to its jobs."""
    if standing is None:
        return "-"
    if standing.over:
        return f"[bold red]OVER[/bold red] {escape(standing.figures)}: {escape(standing.then)}"
    return escape(standing.figures)


@click.command(name="policy")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: every field of the policy.")
@registry_options
@cloud_errors
def policy_cmd(as_json: bool, **conn: str | None) -> None:
    """Print the policy in force: the registry's config/policy.yaml, with the defaults where it sets nothing.

    \b
    Quotas and caps (max_active_instances_per_owner, max_active_instances, max_active_by_family,
    owner_weights), priority classes and who may use them, budgets, limits (instance types, nodes, runtimes,
    waits, attempts), images, safety, idle GPUs, access and prices: what submit checks a spec against, and
    what the launcher admits by. Each field as the policy file names it.
    Example:
      jobplane policy
    """
    from jobplane.model.policy import DEFAULT_POLICY  # with the spec's field types: loaded when a command runs

    registry = client(**conn)
    policy = registry.policy()
    source = "the defaults: config/policy.yaml is absent or sets nothing" if policy == DEFAULT_POLICY else \
        "config/policy.yaml, with the defaults where it sets nothing"
    if as_json:
        click.echo(json.dumps({"registry": registry.url, "source": source, "policy": dataclasses.asdict(policy)},
                              indent=1))
        return
    console = _console()
    console.print(f"the policy in force in {registry.url}: {source}", highlight=False)
    table = Table("FIELD", "VALUE", box=None, header_style="bold")
    for field, value in policy_rows(policy):
        table.add_row(field, value)
    console.print(table)


def policy_rows(policy: Policy) -> list[tuple[str, str]]:
    """Every field of the policy, dotted as the file nests it (budgets.monthly_usd.team-a), with its value as text:
    durations as 30m, money as $500.00, a priority class as its value and owners, unset as `unset`."""
    from jobplane.model.bounds import format_duration

    rows: list[tuple[str, str]] = []

    def add(path: str, value: Any) -> None:
        if path.startswith("priority_classes.") and dataclasses.is_dataclass(value):
            owners = ", ".join(getattr(value, "owners", None) or []) or "every owner"
            rows.append((path, f"{getattr(value, 'value', '?')} (owners: {owners})"))
        elif dataclasses.is_dataclass(value):
            for field in dataclasses.fields(value):
                add(f"{path}.{field.name}" if path else field.name, getattr(value, field.name))
        elif isinstance(value, dict):
            for key, item in sorted(value.items()):
                add(f"{path}.{key}", item)
            if not value:
                rows.append((path, "none"))
        elif value is None:
            rows.append((path, "unset"))
        elif path in DURATIONS:
            rows.append((path, format_duration(int(value)) if value else "0s"))
        elif path.startswith("budgets.monthly_usd."):
            rows.append((path, f"${value:,.2f} a month"))
        elif path in ("default_max_cost", "max_cost_ceiling"):
            rows.append((path, f"${value:,.2f} a job"))
        elif isinstance(value, bool):
            rows.append((path, "yes" if value else "no"))
        elif isinstance(value, list):
            rows.append((path, ", ".join(map(str, value)) or "none"))
        else:
            rows.append((path, f"{value:g}" if isinstance(value, float) else str(value)))

    add("", policy)
    return rows
