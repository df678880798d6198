"""The `jobplane` command in this process, through click's runner (stdout and stderr apart)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from jobplane.cli import cli


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))
