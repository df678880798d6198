"""`jobplane sweep ls | describe | cancel`: hyperparameter sweeps, whose trials are jobs (`jobplane ls` shows a
sweep's trials, and an array's members, as one line unless --trials)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from jobplane.cli.connect import client, cloud_errors, registry_options
from jobplane.model.clock import utcnow
from jobplane.views import cost
from jobplane.views.jobview import human_duration

if TYPE_CHECKING:  # the SDK and the records' models load when a command runs, not for --help
    from jobplane import sdk
    from jobplane.sweeps.record import SweepRecord

# jobplane.sweeps.record's counts beside the states: members not dropped yet, and not looked at (ended)
COUNTED = {"NOT_DROPPED": "not dropped yet", "ENDED": "ended"}

ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "STALLED", "INVALID")



def sweep_row(sweep_id: str, rows: Sequence[dict[str, Any]], kind: str = "sweep",
              record: SweepRecord | None = None, *, everything: bool = False, now: datetime | None = None
              ) -> dict[str, Any]:
    """`jobplane ls`'s one line for the trials of a sweep it lists (rows: the trials' own rows); kind "array": the
    members of an array, and with its record (`record`) the array's state (ARRAY while it runs, then COMPLETED,
    FAILED or CANCELLED), its size and its members by state, those not listed by the record's account (everything:
    every job was listed, so a member not listed has no job yet) and those not dropped yet too."""
    states: dict[str, int] = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    priced = [r["cost"] for r in rows if r["cost"] is not None]
    types = sorted({t for r in rows for t in str(r["instance_type"] or "").split(",") if t})
    what, more = ("members", f"jobplane cancel {sweep_id} cancels them") if kind == "array" else \
        ("trials", f"jobplane sweep describe {sweep_id}")
    row = {"id": sweep_id, "state": kind.upper(), "attempt": None, "nodes": sum(r["nodes"] or 0 for r in rows),
           "instance_type": ",".join(types), "spot": any(r["spot"] for r in rows),
           "age": max((r["age"] for r in rows), default=0), "runtime": None,
           "cost": round(sum(priced), 6) if priced else None, "restarts": sum(r["restarts"] or 0 for r in rows),
           kind: sweep_id, what: len(rows),
           "reason": f"{len(rows)} {what} listed: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                     + f" ({more}; ls --trials lists them)"}
    if record is None:
        return row
    counts = record.counts({r["id"]: r["state"] for r in rows}, unseen="QUEUED" if everything else "ENDED")
    shown = "ARRAY" if record.live else str(record.state)
    return {**row, "state": shown, "size": record.size, "counts": counts,
            "age": (now - record.created_at).total_seconds() if now else row["age"],
            "reason": f"array of {record.size}: {counts_text(counts)} (jobplane describe {sweep_id}"
                      + (f"; {more})" if record.live else ")")}


def counts_text(counts: dict[str, int]) -> str:
    """'3 SUCCEEDED, 2 RUNNING, 3 not dropped yet'."""
    return ", ".join(f"{n} {COUNTED.get(state, state)}" for state, n in counts.items()) or "none"


def grouped(rows: list[tuple[tuple[str, str] | None, dict[str, Any]]],
            arrays: dict[str, SweepRecord] | None = None, *, everything: bool = False,
            now: datetime | None = None) -> list[dict[str, Any]]:
    """((kind, id) of the sweep or array a job belongs to, its row): a sweep's trials, or an array's members, become
    one line where the first of them was. `arrays`: the arrays' records (Client.arrays), each a line with its state,
    size and members by state, one whose members are not listed too (everything: every job was listed)."""
    arrays = arrays or {}
    out: list[dict[str, Any] | tuple[str, str]] = []
    members: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for group, row in rows:
        if group is None:
            out.append(row)
            continue
        if group not in members:
            members[group] = []
            out.append(group)  # its place, filled in below
        members[group].append(row)
    out += [("array", array_id) for array_id in sorted(arrays) if ("array", array_id) not in members]
    return [sweep_row(r[1], members.get(r, []), r[0], arrays.get(r[1]) if r[0] == "array" else None,
                      everything=everything, now=now) if isinstance(r, tuple) else r for r in out]


def describe_array(found: sdk.Sweep, as_json: bool) -> None:
    """`jobplane describe ARRAY`: its state, size, members by state (those not dropped yet too), estimated cost and
    each member dropped so far, by index."""
    now = utcnow()
    detail = found.describe(now)
    record = detail.record
    if as_json:
        click.echo(json.dumps({
            "array": record.model_dump(mode="json", exclude_none=True), "size": record.size,
            "counts": detail.counts, "cost": cost.as_json(detail.cost),
            "members": [{"index": t.number - 1, "job_id": t.job_id, "state": t.state or "QUEUED",
                         "cost": cost.as_json(t.cost), "reason": t.reason} for t in detail.trials]},
            indent=1, default=str))
        return
    console, spec = Console(width=max(160, shutil.get_terminal_size().columns)), record.spec
    parallel = record.section.parallel
    left, ago = record.size - len(record.trials), human_duration((now - record.created_at).total_seconds())
    for name, value in (
            ("id", f"{record.id} (an array: jobs {record.id}-0 to {record.id}-{record.size - 1})"),
            ("state", f"{record.state}" + (f": {record.reason}" if record.reason else "")),
            ("owner", record.owner), ("priority", spec.priority or "-"),
            ("size", f"{record.size} members, at most {parallel} at once, {spec.num_nodes} node(s) each"),
            ("members", counts_text(detail.counts) + (": the array drops the next as one ends" if left and record.live
                                                      else "")),
            ("submitted", f"{record.created_at:%Y-%m-%d %H:%M:%S} UTC ({ago} ago)"),
            ("cost", f"{cost.money(detail.cost)} (estimated: the members' instance time)")):
        console.print(f"[bold]{name:>10}[/bold]  {value}", highlight=False)
    table = Table("INDEX", "MEMBER", "STATE", "EST. COST", "REASON", box=None, header_style="bold")
    for t in detail.trials:
        table.add_row(str(t.number - 1), t.job_id, str(t.state or "QUEUED"), cost.money(t.cost) if t.state else "-",
                      t.reason or "")
    console.print(table)


@click.group(name="sweep")
def sweep() -> None:
    """Hyperparameter sweeps: a spec with a `sweep:` section, submitted with `jobplane submit`; its trials
    are jobs (SWEEP-t001, ...), labelled sweep=SWEEP.

    \b
    Example:
      jobplane submit examples/sweep/sweep.yaml --code examples/sweep
      jobplane sweep describe lr-search
    """


@sweep.command(name="ls")
@click.option("--all", "include_done", is_flag=True, help="Include sweeps that have ended.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@registry_options
@cloud_errors
def ls_cmd(include_done: bool, as_json: bool, **conn: str | None) -> None:
    """List sweeps still at work (or all with --all): state, trials proposed of max_trials, best so far."""
    now, rows = utcnow(), list[dict[str, Any]]()
    for found in client(**conn).sweeps(include_finished=include_done):
        record, best = found.record, found.best
        rows.append({"id": found.id, "state": str(found.state), "trials": len(record.trials),
                     "max_trials": record.sweep.max_trials, "strategy": record.sweep.strategy,
                     "objective": f"{record.sweep.objective.goal} {record.sweep.objective.metric}",
                     "best": best.job_id if best else None, "best_objective": best.objective if best else None,
                     "age": (now - record.created_at).total_seconds(), "reason": record.reason or ""})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table("ID", "STATE", "TRIALS", "STRATEGY", "OBJECTIVE", "BEST", "AGE", "REASON", box=None,
                  header_style="bold")
    for row in rows:
        leader = f"{row['best']} ({row['best_objective']:.6g})" if row["best"] else "-"
        table.add_row(row["id"], row["state"], f"{row['trials']}/{row['max_trials']}", row["strategy"],
                      row["objective"], leader, human_duration(row["age"]), row["reason"])
    Console(width=max(160, shutil.get_terminal_size().columns)).print(table)


@sweep.command()
@click.argument("sweep_id", metavar="SWEEP")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the record, the trials, the cost.")
@registry_options
@cloud_errors
def describe(sweep_id: str, as_json: bool, **conn: str | None) -> None:
    """Show a sweep: its state, best trial, total estimated cost, and a table of its trials, best first,
    with their parameters, objective, state and estimated cost.

    \b
    An objective in the table is a trial's final value once it SUCCEEDED, else the latest it printed (~).
    Example:
      jobplane sweep describe lr-search --json
    """
    now = utcnow()
    detail = client(**conn).sweep(sweep_id).describe(now)
    record, spent = detail.record, detail.cost
    if as_json:
        click.echo(json.dumps({
            "sweep": record.model_dump(mode="json", exclude_none=True), "cost": cost.as_json(spent),
            "trials": [{"number": t.number, "job_id": t.job_id, "params": t.params, "state": t.state,
                        "objective": t.objective, "final": t.final, "cost": cost.as_json(t.cost), "reason": t.reason}
                       for t in detail.trials]}, indent=1, default=str))
        return
    sweep_spec, console = record.sweep, Console(width=max(160, shutil.get_terminal_size().columns))
    best = record.best
    for name, value in (
            ("id", record.id), ("state", f"{record.state}" + (f": {record.reason}" if record.reason else "")),
            ("strategy", f"{sweep_spec.strategy}, {len(record.trials)} of {sweep_spec.max_trials} trials proposed, "
                         f"at most {sweep_spec.max_parallel} at once, {detail.live} live"),
            ("objective", f"{sweep_spec.objective.goal} {sweep_spec.objective.metric}"
                          + (f", early stop: {sweep_spec.early_stop.rule} after step {sweep_spec.early_stop.after_step}"
                             if sweep_spec.early_stop else "")),
            ("best", f"{best.job_id} {sweep_spec.objective.metric} {best.objective:.6g} "
                     f"{_params(best.params)}; model: {best.artifacts}" if best else "-"),
            ("cost", f"{cost.money(spent)} (estimated: the trials' instance time)")):
        console.print(f"[bold]{name:>10}[/bold]  {value}", highlight=False)
    names = sorted(record.sweep.parameters)
    table = Table("TRIAL", *(n.upper() for n in names), sweep_spec.objective.metric.upper(), "STATE", "EST. COST",
                  "REASON", box=None, header_style="bold")
    for t in detail.trials:
        objective = "-" if t.objective is None else f"{'' if t.final else '~'}{t.objective:.6g}"
        table.add_row(t.job_id, *(_value(t.params.get(n)) for n in names), objective, str(t.state or "QUEUED"),
                      cost.money(t.cost) if t.state else "-", t.reason or "")
    console.print(table)


@sweep.command()
@click.argument("sweep_id", metavar="SWEEP")
@registry_options
@cloud_errors
def cancel(sweep_id: str, **conn: str | None) -> None:
    """Cancel a sweep: it proposes no more trials, and each live trial is cancelled as `jobplane cancel`
    cancels a job (its agents checkpoint, sync and stop; one not started never runs).

    \b
    Example:
      jobplane sweep cancel lr-search
    """
    done = client(**conn).sweep(sweep_id).cancel()
    click.echo(f"{sweep_id} CANCELLED ({len(done.record.trials)} trials proposed)")


def _value(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _params(params: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={_value(v)}" for k, v in sorted(params.items())) + ")"
