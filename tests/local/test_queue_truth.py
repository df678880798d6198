"""The queue tells the truth on a local cloud (issue 58), one AWS cloud for the module: `submit` of a spec naming a
priority class the policy lacks exits non-zero naming `priority`, nothing dropped; an array of 4 (team-x's, 2 at a
time under a quota of 2) shows in `ls` as one line with its size and its members by state, those not dropped yet
too, and `queue` lists the members not dropped; `queue` starts with each owner's usage (team-x's nodes in use of
its quota, team-y's job waiting for the array, both owners' weights and fair share of the deployment's cap); a job
of team-y `after:` the array (submitted with `--priority`) launches only once every member SUCCEEDED, and the array
ends COMPLETED in `ls --all`. Tiny shell jobs: the members wait for a gate file, so what is asserted while they run
is seen, then end at once."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from jobplane.local.demo import CloudProcess
from jobplane.model import keys
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, policy_over, shell_code, write_spec

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
POLICY = {"max_active_instances_per_owner": 2, "max_active_instances": 3, "owner_weights": {"team-x": 2, "team-y": 1},
          "priority_classes": {"urgent": {"value": 100, "owners": ["team-y"]}}}
SIZE = 4  # 2 at a time: 2 members running and 2 not dropped prove what 4 and 4 did, at half the VMs


def launched(events: list[dict[str, Any]]) -> datetime:
    """When the job's one attempt was launched (the write that recorded its VMs)."""
    (at,) = [e["time"] for e in events if e.get("to") == State.LAUNCHING and e.get("instances")]
    return datetime.fromisoformat(at)


def ended(events: list[dict[str, Any]]) -> datetime:
    (at,) = [e["time"] for e in events if e.get("to") == State.SUCCEEDED]
    return datetime.fromisoformat(at)


@pytest.mark.timeout(300)
def test_submit_checks_the_policy_an_array_is_first_class_and_a_job_after_it_waits_for_every_member(
        cloud: CloudProcess, tmp_path: Path) -> None:
    reg, gate, code = cloud.registry(), tmp_path / "gate", shell_code(tmp_path)
    (code / "hold.sh").write_text(f"for i in $(seq 900); do [ -e {gate} ] && exit 0; sleep 0.1; done; exit 1\n")
    with policy_over(cloud, POLICY):
        refused = cloud.cli("submit", str(write_spec(tmp_path, "typo", "exit 0", priority="urgnt", spot="false")),
                            "--code", str(code))
        assert refused.returncode == 1, refused.stdout
        assert "priority: 'urgnt' is not a priority class of this platform (urgent)" in refused.stderr
        assert [k for k, _, _ in reg.listing(keys.QUEUE)] == []  # nothing dropped

        shards = write_spec(tmp_path, "shards", '"sh hold.sh"', owner="team-x", spot="false",
                            array=f"{{size: {SIZE}, max_parallel: 2}}")
        assert cli_ok(cloud, "submit", str(shards), "--code", str(code), "--id", "shards").strip() == "shards"
        wait_for("the launcher to record the array", lambda: reg.has(keys.sweep_record("shards")), 30, every=0.2)
        merge = write_spec(tmp_path, "merge", "exit 0", owner="team-y", spot="false", after="[shards]")
        assert cli_ok(cloud, "submit", str(merge), "--code", str(code), "--id", "merge", "--priority",
                      "urgent").strip() == "merge"

        def running() -> list[Any]:
            # before the launcher takes the drop, `shards` is a queued drop's row, without counts
            return [r for r in json.loads(cli_ok(cloud, "ls", "--json")) if r["id"] == "shards"
                    and r.get("counts", {}).get("RUNNING") == 2]

        try:
            (row,) = wait_for("2 members running", running, 120, every=0.5)
            assert (row["state"], row["size"], row["counts"]) == ("ARRAY", SIZE, {"RUNNING": 2, "NOT_DROPPED": 2})
            assert row["reason"].startswith(f"array of {SIZE}: 2 RUNNING, 2 not dropped yet"), row
            found = json.loads(cli_ok(cloud, "queue", "--json"))
            owners = {o["owner"]: o for o in found["usage"]["owners"]}
            assert (owners["team-x"]["in_use"], owners["team-x"]["quota"], owners["team-x"]["weight"],
                    owners["team-x"]["fair_share"]) == (2, 2, 2, 3.0), owners  # alone holding nodes: the whole cap
            assert (owners["team-y"]["in_use"], owners["team-y"]["weight"], owners["team-y"]["fair_share"]) == (
                0, 1, 1.0), owners  # if it came: 3 x 1 / (2 + 1)
            assert found["usage"]["deployment"]["in_use"] == 2 and found["usage"]["deployment"]["limit"] == 3
            waiting = {j["id"]: j for j in found["jobs"]}
            assert waiting["merge"]["priority_class"] == "urgent"
            assert waiting["merge"]["why"] == "dependency: waiting for shards (RUNNING)"
            assert waiting["shards"]["array"] == {"size": SIZE, "not_dropped": 2}
            table = cli_ok(cloud, "queue")
            assert "team-x" in table and "2 of 2" in table and "deployment cap: 2 of 3 nodes in use" in table
            assert reg.job("merge").state == State.WAITING_CAPACITY
        finally:
            gate.touch()
        wait_for("merge to end", lambda: reg.job("merge").state in (State.SUCCEEDED, State.FAILED), 180, every=0.5)
    members = [f"shards-{i}" for i in range(SIZE)]
    assert [reg.job(m).state for m in members] == [State.SUCCEEDED] * SIZE
    assert reg.job("merge").state == State.SUCCEEDED, reg.job("merge").reason
    assert launched(reg.events("merge")) >= max(ended(reg.events(m)) for m in members)
    (row,) = [r for r in json.loads(cli_ok(cloud, "ls", "--all", "--json")) if r["id"] == "shards"]
    assert (row["state"], row["size"], row["counts"]) == ("COMPLETED", SIZE, {"SUCCEEDED": SIZE})
    assert "COMPLETED" in " ".join(cli_ok(cloud, "describe", "shards").split())
