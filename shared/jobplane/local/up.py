"""`jobplane local up [--cloud aws|gcp]`: the local cloud of the kind asked for (jobplane.local.aws or
jobplane.local.gcp, each a jobplane.local.cloud.LocalCloud) in the foreground, until SIGINT or SIGTERM; then nothing
of it is left."""

from __future__ import annotations

import logging
import signal
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from jobplane.local.cloud import FUNCTIONS_LOG, LocalCloud, team
from jobplane.local.console import ConsoleHandler


def make(cloud: str, state_dir: Path, port: int = 0, tick: float = 1.0,
         policy: Mapping[str, Any] | None = None, baked_agent: bool = False,
         faults: tuple[float, int] | None = None) -> LocalCloud:
    """faults: (rate, seed) of `local up --faults` (the AWS cloud's only, for now)."""
    if cloud == "gcp":
        from jobplane.local.gcp import GcpLocalCloud

        if faults is not None:
            raise RuntimeError("--faults: the local AWS cloud only, for now")
        return GcpLocalCloud(state_dir, port=port, tick=tick, policy=policy, baked_agent=baked_agent)
    from jobplane.clouds.faults import Faults
    from jobplane.local.aws import AwsLocalCloud

    return AwsLocalCloud(state_dir, port=port, tick=tick, policy=policy, baked_agent=baked_agent,
                         faults=Faults(*faults) if faults is not None else None)


def up(state_dir: Path, port: int, tick: float, cloud: str = "aws", policy: Mapping[str, Any] | None = None,
       baked_agent: bool = False, member: str | None = None, faults: tuple[float, int] | None = None) -> None:
    """Run until SIGINT/SIGTERM, then leave nothing behind. member: the second shell's exports are a member's of
    that team (env-<team>.sh), not the platform team's (env.sh)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        filename=state_dir / FUNCTIONS_LOG)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    local = make(cloud, state_dir, port, tick, policy, baked_agent, faults)
    logging.getLogger("local-cloud").addHandler(ConsoleHandler(local.console))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        local.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    local.start()
    exports, env_file = local.exports, local.state_dir / "env.sh"
    if member is not None:
        exports, env_file = local.member_exports(team(member)), local.state_dir / f"env-{member}.sh"
        shell = {**exports, "JOBPLANE_LOCAL_STATE": str(local.state_dir.resolve())}
        env_file.write_text("".join(f"export {k}={v}\n" for k, v in shell.items()))
    print(f"local {cloud} cloud up; in another shell" + (f", as a member of {member}:" if member else ":"), flush=True)
    for key, value in exports.items():
        print(f"export {key}={value}", flush=True)
    print(f"(or: source {env_file})  Ctrl-C stops everything.", flush=True)
    print(f"function logs and metrics: {local.state_dir / FUNCTIONS_LOG}", flush=True)
    if local.oci_image:
        print(f"container image (a `container:` job's image here; also in `jobplane local status`): {local.oci_image}",
              flush=True)
    try:
        local.run()
    finally:
        local.stop()
        print("local cloud stopped", flush=True)
