"""A job's stored files: `jobplane checkpoints`."""

from __future__ import annotations

import json

import click

from jobplane.cli.connect import client, cloud_errors, registry_options
from jobplane.model.clock import utcnow
from jobplane.views.jobview import human_size

SHOWN = 200  # files listed; the count and size are of all


@click.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The newest checkpoint and the files as JSON.")
@registry_options
@cloud_errors
def checkpoints(job_id: str, as_json: bool, **conn: str | None) -> None:
    """Show a job's checkpoints in the bucket: the newest (what its next attempt restores) and the files.

    \b
    A team member sees its own team's jobs' checkpoints only.
    Example:
      jobplane checkpoints demo-1122-113005-ab12
    """
    job = client(**conn).get(job_id)
    newest, stored = job.checkpoint(), job.stored("checkpoints", limit=SHOWN)
    if as_json:
        found = None if newest is None else {"written_at": newest.written_at.isoformat(), "rank": newest.rank,
                                             "attempt": newest.attempt, "files": newest.files, "step": newest.step}
        click.echo(json.dumps({"newest": found, "count": stored.count, "size": stored.size,
                               "files": [{"path": path, "size": size} for path, size in stored.files]}, indent=1))
        return
    click.echo(f"{job_id}: " + (newest.describe(utcnow()) if newest else "no checkpoint yet"))
    for path, size in stored.files:
        click.echo(f"{human_size(size):>10}  {path}")
    if stored.count > len(stored.files):
        click.echo(f"... {stored.count - len(stored.files)} more")
    click.echo(f"{stored.count} objects, {human_size(stored.size)}")
