"""`jobplane tensorboard`: jobs' TensorBoard runs, copied from the bucket and kept in step with it, served by
TensorBoard (the `tensorboard` package, an extra) on loopback, one run per job and attempt."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from jobplane.cli.connect import UserError, client, cloud_errors, registry_options
from jobplane.cli.params import DurationType

LOOPBACK = "127.0.0.1"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a SIGTERM stops it as Ctrl-C does: TensorBoard too, and the copy is removed


def stop(server: subprocess.Popen[bytes]) -> None:
    """End TensorBoard and whatever it started (its session): SIGTERM, then SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, sig)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # the leader is gone: what it started goes too
        return


def skipped(refused: list[str]) -> None:
    for reason in refused:
        click.echo(f"skipped: {reason}", err=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="ID [ID ...]")
@click.option("--port", type=int, default=6006, show_default=True, help="Port to serve on (0: any free port).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the local copy here (default: a temporary directory, removed at the end).")
@click.option("--every", type=DurationType(), default="15s", show_default=True,
              help="How often the copy is brought in step with the bucket.")
@registry_options
@cloud_errors
def tensorboard(job_ids: tuple[str, ...], port: int, directory: Path | None, every: int, **conn: str | None) -> None:
    """Serve TensorBoard over jobs' event files (their spec's `tensorboard: {log_dir}`), on 127.0.0.1.

    \b
    The runs are named <job>/attempt-<n> (another rank's: <job>/attempt-<n>-rank-<r>), so attempts and jobs
    compare side by side; the copy follows the bucket while the jobs run. Needs the tensorboard package:
    pip install 'jobplane[tensorboard]'. Ctrl-C stops it.
    Example:
      jobplane tensorboard lr-0p01 lr-0p02
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError("jobplane tensorboard needs the tensorboard package: pip install 'jobplane[tensorboard]'")
    signal.signal(signal.SIGTERM, _interrupted)
    dest = directory or Path(tempfile.mkdtemp(prefix="jobplane-tensorboard-"))
    try:
        copy = client(**conn).tensorboard(job_ids, dest)
        found = copy.sync()
        skipped(found.refused)
        if not found.runs:
            click.echo(f"no TensorBoard event files yet for {', '.join(job_ids)} (they come once a job writes to "
                       "its tensorboard.log_dir); waiting for them", err=True)
        port = port or free_port()
        # in a session of its own: TensorBoard starts its data server as a child, which a stop must end too
        server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(dest), "--host",
                                   LOOPBACK, "--port", str(port), "--reload_interval", "5"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        click.echo(f"TensorBoard on http://{LOOPBACK}:{port}/ over {dest}: " + (", ".join(sorted(found.runs)) or
                                                                              "no runs yet"), err=True)
        try:
            while True:
                try:
                    server.wait(every)
                    raise UserError(f"TensorBoard exited with {server.returncode} (is port {port} taken?)")
                except subprocess.TimeoutExpired:
                    pass
                skipped(copy.sync().refused)
        except KeyboardInterrupt:
            pass
        finally:
            stop(server)
    finally:
        if directory is None:
            shutil.rmtree(dest, ignore_errors=True)
