"""`jobplane validate` and `jobplane schema`: the commands on spec files, which need no registry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from jobplane.model.errors import FieldError
    from jobplane.model.policy import Policy


@click.command()
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
    from jobplane.model.errors import SpecError  # the models load when a command runs, not for --help
    from jobplane.model.policy import DEFAULT_POLICY, parse_policy

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
    from jobplane.model.errors import FieldError, SpecError
    from jobplane.model.policy import check_against_policy
    from jobplane.model.spec import parse_spec

    try:
        text = path.read_text()
    except OSError as exc:
        return [FieldError("(file)", f"cannot read: {exc.strerror}")]
    try:
        spec = parse_spec(text, source=path.name)
    except SpecError as exc:
        return exc.errors
    return check_against_policy(spec, policy)


@click.command()
def schema() -> None:
    """Print the job spec's JSON Schema (also at schema/jobspec.schema.json).

    \b
    Example:
      jobplane schema > jobspec.schema.json
    """
    from jobplane.model.spec import json_schema_text

    click.echo(json_schema_text(), nl=False)
