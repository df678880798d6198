"""`jobplane secret set|ls|rm`: a team's tokens in the deployment's secret store (docs/operations.md#secrets). A value
is read from stdin or a file, never from an argument (a shell's history and `ps` would show it), and never printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from jobplane.cli.connect import client, cloud_errors, registry_options

OWNER_HELP = "The secret's owner (env JOBPLANE_OWNER; default: default). A team member sets only its own team's."


@click.group(name="secret")
def secret() -> None:
    """A team's secrets: Hugging Face, W&B and registry tokens a job reads by name (`secrets:` in its spec).

    \b
    Examples:
      jobplane secret set hf-token --owner team-s < token.txt
      jobplane secret ls --owner team-s
      jobplane secret rm hf-token --owner team-s
    """


@secret.command(name="set")
@click.argument("name")
@click.option("--owner", envvar="JOBPLANE_OWNER", help=OWNER_HELP)
@click.option("--from-file", "from_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the value from this file (as it is) instead of stdin.")
@registry_options
@cloud_errors
def set_cmd(name: str, owner: str | None, from_file: Path | None, **conn: str | None) -> None:
    """Set or rotate secret NAME: the value from stdin (one trailing newline dropped) or --from-file, up to 64 KiB.

    The next attempt of every job naming it reads the new value.
    """
    if from_file is not None:
        value = from_file.read_bytes()
    else:
        if sys.stdin.isatty():
            click.echo(f"value of {name} (then Ctrl-D):", err=True)
        value = sys.stdin.buffer.read().removesuffix(b"\n")  # `echo TOKEN |` and a here-string end with one
    client(**conn).set_secret(name, value, owner=owner)
    click.echo(f"secret {name} set")


@secret.command(name="ls")
@click.option("--owner", envvar="JOBPLANE_OWNER", help="Only this owner's (env JOBPLANE_OWNER).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: [{owner, name, set_at}].")
@registry_options
@cloud_errors
def ls_cmd(owner: str | None, as_json: bool, **conn: str | None) -> None:
    """The secrets' names, owners and when each was set: never a value."""
    found = client(**conn).secrets(owner=owner)
    if as_json:
        click.echo(json.dumps([{"owner": s.owner, "name": s.name,
                                "set_at": s.set_at.isoformat() if s.set_at else None} for s in found], indent=1))
        return
    click.echo(f"{'OWNER':<24} {'NAME':<34} SET")
    for info in found:
        when = f"{info.set_at:%Y-%m-%d %H:%M:%S %Z}".strip() if info.set_at else "-"
        click.echo(f"{info.owner:<24} {info.name:<34} {when}")


@secret.command(name="rm")
@click.argument("name")
@click.option("--owner", envvar="JOBPLANE_OWNER", help=OWNER_HELP)
@registry_options
@cloud_errors
def rm_cmd(name: str, owner: str | None, **conn: str | None) -> None:
    """Delete secret NAME. A job naming it is refused at submit from then on, and a running one's next attempt
    fails naming the field."""
    if not client(**conn).remove_secret(name, owner=owner):
        raise click.ClickException(f"no secret {name}")
    click.echo(f"secret {name} removed")
