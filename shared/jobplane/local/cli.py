"""`jobplane local ...`: start the local cloud, and do to it what a cloud does (preempt, kill, a stray instance,
a function that stops running). Registered on the `jobplane` group by jobplane.cli; never deployed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

state_dir_option = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                                help="Where the local cloud keeps its state (env JOBPLANE_LOCAL_STATE; "
                                     "default .jobplane).")


@click.group()
def local() -> None:
    """Run the whole control plane on this machine: moto for AWS (or fakes of GCS and Compute Engine for
    GCP), local processes as VMs.

    \b
    Example:
      jobplane local up            # shell 1, until Ctrl-C or `jobplane local down` (--cloud gcp: the GCP one)
      source .jobplane/env.sh      # shell 2
      jobplane submit examples/demo.yaml --code examples/train
    """


def control(state: Path | None, action: str, body: dict[str, Any]) -> Any:
    from jobplane.local.control import ControlError, call, state_dir

    try:
        return call(state_dir(state), action, body)
    except ControlError as exc:
        raise click.ClickException(str(exc)) from None


def no_running_instance(job_id: str, rank: int | None) -> click.ClickException:
    """The one-line error (exit 1) of a preempt or kill that finds nothing to hit."""
    return click.ClickException(f"job {job_id} has no running instance"
                                + (f" with rank {rank}" if rank is not None else ""))


@local.command()
@click.option("--cloud", type=click.Choice(["aws", "gcp"]), default="aws", show_default=True,
              help="aws: moto, EC2 instances, Lambda handlers; gcp: the GCS and Compute Engine fakes, GCE VMs, Cloud "
                   "Functions through functions-framework.")
@click.option("--port", type=int, default=5055, show_default=True,
              help="Port of the cloud's API: moto's, or the GCS fake's (Compute Engine's: the next one); 0: any free.")
@click.option("--tick", type=float, default=1.0, show_default=True,
              help="Seconds between runner/trigger passes; scheduled functions run every max(tick, 2) s (every "
                   "15 s while the cloud is idle: no VM, no job queued or live, nothing written since they ran).")
@click.option("--ui-port", type=int, default=8765, show_default=True,
              help="Port of the dashboard (`jobplane ui`) started beside it on 127.0.0.1; 0: any free, -1: none.")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Policy fields (config/policy.yaml's) over the local cloud's, e.g. `access: {ssh: true}` for "
                   "`jobplane ssh`; a section it names is merged field by field.")
@click.option("--baked-agent", is_flag=True,
              help="Boot the VMs as from an image baked with the agent: their bootstrap finds it and skips the "
                   "download (a faster boot; without it every VM fetches its agent, as on a stock image).")
@click.option("--as", "member", metavar="TEAM",
              help="Print the exports of a member of this team instead of the platform team's: it submits, reads "
                   "and cancels only its own team's jobs, as the deployment's IAM grants a team member.")
@click.option("--faults", "fault_rate", type=click.FloatRange(0, 1), default=None, metavar="RATE",
              help="The cloud's APIs fail on demand: RATE of the calls get the service's throttle or server error, "
                   "some lose the answer of a call that took effect, multi-node launches meet capacity errors and "
                   "new instances show in listings up to 30 s late (docs/operations.md). AWS only, for now.")
@click.option("--faults-seed", type=int, default=0, show_default=True, help="Which faults --faults draws.")
@state_dir_option
def up(cloud: str, port: int, tick: float, ui_port: int, policy_file: Path | None, baked_agent: bool,
       member: str | None, fault_rate: float | None, faults_seed: int, state_dir: Path | None) -> None:
    """Start the local cloud in the foreground; print the exports a second shell needs. Ctrl-C stops it all.

    \b
    Example:
      jobplane local up --cloud gcp --port 5055 --tick 1
      jobplane local up --policy ssh.yaml   # ssh.yaml: access: {ssh: true}
      jobplane local up --as team-a         # the second shell is a member of team-a
      jobplane local up --faults 0.05       # 5% of the cloud's API calls fail as AWS's do
    """
    from jobplane.local.control import state_dir as default_state_dir
    from jobplane.local.dashboard import Beside
    from jobplane.local.up import up as run_up

    if fault_rate is not None and cloud != "aws":
        raise click.UsageError("--faults: the local AWS cloud only, for now")
    policy = read_policy(policy_file) if policy_file is not None else None
    directory = default_state_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    ui = Beside(directory, ui_port, os.environ) if ui_port >= 0 else None
    try:
        run_up(directory, port, tick, cloud, policy, baked_agent, member,
               faults=(fault_rate, faults_seed) if fault_rate is not None else None)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if ui is not None:
            ui.stop()


def read_policy(path: Path) -> dict[str, Any]:
    """`local up --policy FILE`'s fields, checked over the local policy before anything starts."""
    from jobplane.local.cloud import local_policy
    from jobplane.model.errors import SpecError
    from jobplane.model.yaml_input import load_document

    try:
        fields = load_document(path.read_bytes(), "policy")
        local_policy("", fields)
    except SpecError as exc:
        raise click.ClickException("; ".join(f"{path}: {err}" for err in exc.errors)) from None
    return fields


@local.command()
@click.argument("job_id", metavar="JOB")
@click.option("--rank", type=int, help="Only this rank's instance (default: every instance of the job).")
@click.option("--grace", type=float, default=10, show_default=True,
              help="Seconds between the Spot notice and the end of the VM (EC2 gives 120, GCE about 30).")
@state_dir_option
def preempt(job_id: str, rank: int | None, grace: float, state_dir: Path | None) -> None:
    """Reclaim a job's Spot VMs the way the cloud does: EC2's notice in IMDS and EventBridge, then termination;
    GCE's instance/preempted and its shutdown-script, then deletion.

    \b
    Example:
      jobplane local preempt demo-1122-113005-ab12 --grace 5
    """
    hit = control(state_dir, "preempt", {"job_id": job_id, "rank": rank, "grace": grace})
    if not hit:
        raise no_running_instance(job_id, rank)
    for item in hit:
        click.echo(f"{item['instance_id']} (rank {item['rank']}): notice {item['notice']}")


@local.command()
@click.argument("job_id", metavar="JOB")
@click.option("--rank", type=int, help="Only this rank's instance (default: every instance of the job).")
@state_dir_option
def kill(job_id: str, rank: int | None, state_dir: Path | None) -> None:
    """Kill a job's instance without warning, like a VM that dies: processes killed, instance terminated.

    \b
    Example:
      jobplane local kill two-node-1122-113005-ab12 --rank 1
    """
    hit = control(state_dir, "kill", {"job_id": job_id, "rank": rank})
    if not hit:
        raise no_running_instance(job_id, rank)
    click.echo(" ".join(hit))


@local.command()
@click.option("--unmanaged", is_flag=True, help="No jobplane:managed tag: jobplane must never touch it.")
@click.option("--job", "job_id", help="Tag it with this job id (default: none, an orphan).")
@click.option("--user-data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Script the instance runs (default: none, the VM idles).")
@state_dir_option
def instance(unmanaged: bool, job_id: str | None, user_data: Path | None, state_dir: Path | None) -> None:
    """Start an instance by hand (as a user would, outside jobplane); print its id.

    \b
    Example:
      jobplane local instance              # managed but no job: the check should reap it
      jobplane local instance --unmanaged  # not ours: must survive every check
    """
    body = {"managed": not unmanaged, "job_id": job_id, "user_data": user_data.read_text() if user_data else ""}
    click.echo(control(state_dir, "instances", body)["instance_id"])


@local.command()
@click.argument("function")
@click.option("--resume", is_flag=True, help="Deliver its events and schedules again.")
@state_dir_option
def pause(function: str, resume: bool, state_dir: Path | None) -> None:
    """Stop a function from running, as if it failed every time: see what the rest and the cloud do without it.

    \b
    Nothing is delivered to it (its events are not kept for later); the scheduled runs catch up on resume.
    Example:
      jobplane local pause uptime_cap      # GCE's own maxRunDuration is then the only uptime cap
      jobplane local pause uptime_cap --resume
    """
    paused = control(state_dir, "pause", {"function": function, "paused": not resume})["paused"]
    click.echo(f"paused: {', '.join(paused) or 'none'}")


@local.command("as")
@click.argument("team")
@state_dir_option
def as_member(team: str, state_dir: Path | None) -> None:
    """Print the exports of a member of TEAM for the running local cloud: a shell that sources them submits,
    reads and cancels only TEAM's jobs, under the deployment's grants to a team member (AWS: a role tagged
    jobplane-owner=TEAM with the stack's submitter policy; GCP: a member of the module's submitters[TEAM]).

    \b
    Example:
      eval "$(jobplane local as team-a)"
    """
    for key, value in control(state_dir, "member", {"owner": team}).items():
        click.echo(f"export {key}={value}")


@local.command()
@click.option("--timeout", type=click.FloatRange(1, 600), default=60, show_default=True,
              help="Seconds to wait for it to have stopped.")
@state_dir_option
def down(timeout: float, state_dir: Path | None) -> None:
    """Stop the local cloud of the state dir, as Ctrl-C in its shell does: its VMs, emulators and functions stop
    and it leaves nothing behind.

    \b
    Example:
      jobplane local down
    """
    import time

    from jobplane.local.control import STATE_FILE
    from jobplane.local.control import state_dir as directory_of

    state = directory_of(state_dir) / STATE_FILE
    control(state_dir, "down", {})
    deadline = time.monotonic() + timeout
    while state.exists():  # the cloud removes it last, once everything it started has stopped
        if time.monotonic() > deadline:
            raise click.ClickException(f"the local cloud was asked to stop but is still running after {timeout:g} s")
        time.sleep(0.2)
    click.echo("local cloud stopped")


@local.command()
@state_dir_option
def status(state_dir: Path | None) -> None:
    """Show the running local cloud's instances, function invocations and the reference of the container image
    its registry serves (oci_image: what a `container:` job names here; it changes with each `local up`) as JSON.

    \b
    Example:
      jobplane local status
    """
    click.echo(json.dumps(control(state_dir, "status", {}), indent=1))
