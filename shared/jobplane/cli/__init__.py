"""`jobplane ...`: the command line for ML engineers and platform teams.

The group and its entry point. The commands live by what they work on: specs.py (spec files, no registry),
jobs.py (a job's life: submit, ls, describe, logs, wait, cancel), queue.py (queue, policy: the quotas, the waiting
jobs, the policy in force), sweeps.py (`sweep ls|describe|cancel`, an array's describe and ls line), reports.py
(metrics, cost), secrets.py (`secret set|ls|rm`), ssh.py (a shell in a job's VM) and jobplane.local.cli
(`jobplane local`, the local cloud); connect.py is how they reach the registry, follow.py how they follow a
job, params.py their option types.
"""

from __future__ import annotations

import click

from jobplane.cli import files, jobs, queue, reports, secrets, specs, ssh, sweeps
from jobplane.cli.tensorboard import tensorboard
from jobplane.cli.ui import ui
from jobplane.local.cli import local


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobplane")
def cli() -> None:
    """jobplane: run ML training jobs on plain cloud VMs from specs dropped in a bucket.

    \b
    \b
    Quick start (no cloud account needed):
      jobplane local up                                   # shell 1: the local cloud
      jobplane submit examples/demo.yaml --code examples/train -f
      jobplane ls && jobplane wait ID --for terminal --timeout 10m
      jobplane metrics ID --plot loss.png
    """


for command in (specs.validate, specs.schema, jobs.submit, jobs.ls_cmd, queue.queue_cmd, queue.policy_cmd,
                jobs.describe, jobs.logs, jobs.wait, jobs.cancel, files.checkpoints, sweeps.sweep, reports.metrics_cmd,
                reports.cost_cmd, secrets.secret, tensorboard, ssh.ssh, local):
    cli.add_command(command)
cli.add_command(ui)  # jobplane.cli.ui: the web dashboard


def main() -> None:
    cli()
