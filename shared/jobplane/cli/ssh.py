"""`jobplane ssh`: a shell in a running job's VM, or one command there.

The way in depends on where the registry is: the local cloud's VMs are entered directly (its control server
says how), an AWS deployment's through SSM Session Manager (`aws ssm start-session`, with the Session Manager
plugin), a GCP one's through IAP (`gcloud compute ssh --tunnel-through-iap`). The policy's `access.ssh` must
allow it; the deployment must have given the VMs the way in (jobplane.sdk.shell).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import click

from jobplane.cli.connect import UserError, client, cloud_errors, registry_options


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("job_id", metavar="ID")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--rank", type=int, default=0, show_default=True, help="Which node of the job.")
@registry_options
@cloud_errors
def ssh(job_id: str, command: tuple[str, ...], rank: int, **conn: str | None) -> None:
    """Open a shell in a running job's VM (or a failed one's its `debug_hold` keeps), or run COMMAND there (after --).

    \b
    Example:
      jobplane ssh demo-1122-113005-ab12                 # a shell on rank 0
      jobplane ssh demo-1122-113005-ab12 --rank 1 -- nvidia-smi
    """
    from jobplane import sdk  # loaded by a command that runs, not by --help
    from jobplane.sdk import shell

    try:
        sdk_client = client(**conn)
        instance = sdk_client.get(job_id).shell_target(rank)
    except sdk.Refused as exc:
        raise UserError(str(exc)) from None
    argv = list(command)
    if os.environ.get("JOBPLANE_LOCAL_STATE"):
        code = _local(instance, argv)
    else:
        settings = sdk_client.settings
        way = (shell.iap_argv(instance, os.environ.get("GOOGLE_CLOUD_PROJECT"), argv) if settings.cloud == "gcp"
               else shell.ssm_argv(instance, settings.region, argv))
        if shutil.which(way[0]) is None:
            raise UserError(f"{way[0]} is not installed: `jobplane ssh` runs {' '.join(way[:3])} ...")
        code = subprocess.run(way, check=False).returncode
    sys.exit(code)


def _local(instance: str, command: list[str]) -> int:
    from jobplane.local.control import ControlError, call, state_dir

    try:
        how = call(state_dir(), "shell", {"instance_id": instance})
    except ControlError as exc:
        raise UserError(str(exc)) from None
    if "error" in how:
        raise UserError(how["error"])
    argv = how["argv"] + (["-c", " ".join(command)] if command else [])
    return subprocess.run(argv, env=how["env"], cwd=how["cwd"], check=False).returncode
