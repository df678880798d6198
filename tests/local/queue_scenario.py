"""A team's queue on a local cloud (issue 40), one scenario both clouds' modules run on their own cloud: with an
owner quota of 2 and priority classes in the policy, team-q drops 6 jobs of mixed priorities, one of them waiting
for another's success. The first two run until the test opens a gate (a file on this machine), so the other four
are seen waiting in `jobplane queue`; then every launch happens in the order the rules give, by the events' times,
never more than 2 jobs live at once."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from jobplane.local.demo import CloudProcess
from jobplane.model.states import State
from tests.helpers import wait_for
from tests.local.conftest import cli_ok, policy_over, submit, write_spec

OWNER = "team-q"
POLICY = {"max_active_instances_per_owner": 2,
          "priority_classes": {"urgent": {"value": 100, "owners": [OWNER]}, "batch": {"value": -10}}}
# in the order they are dropped, each with its spec's own fields (after: names a job of the scenario)
DROPS: tuple[tuple[str, dict[str, str]], ...] = (
    ("first-1", {}), ("first-2", {}), ("plain", {}), ("overnight", {"priority": "batch"}),
    ("urgent", {"priority": "urgent"}), ("follow", {"priority": "batch", "after": "first-1"}))
# the first two when they are dropped; then the line: a higher class first, FIFO within one (overnight was dropped
# before follow, which joins the line only once first-1 SUCCEEDED)
EXPECTED = ["first-1", "first-2", "urgent", "plain", "overnight", "follow"]


def run_team_queue(cloud: CloudProcess, tmp_path: Path, /, **spec: str) -> None:
    """The scenario on `cloud`, its specs with `spec`'s fields (the cloud's instance type)."""
    gate, code = tmp_path / "gate", tmp_path / "code"
    code.mkdir()  # no requirements.txt: a VM installs nothing before its run
    (code / "hold.sh").write_text(f"for i in $(seq 600); do [ -e {gate} ] && exit 0; sleep 0.1; done; exit 1\n")
    reg = cloud.registry()
    ids: dict[str, str] = {}
    with policy_over(cloud, POLICY):
        for name, own in DROPS:
            fields = {"owner": OWNER, "spot": "false", **spec, **own}
            fields.update({"after": f"[{ids[own['after']]}]"} if "after" in own else {})
            run = "sh hold.sh" if name.startswith("first") else "sleep 1"
            ids[name] = submit(cloud, write_spec(tmp_path, name, run, **fields), code)
            if name in ("first-2", "overnight"):
                # A job's place is when the launcher took its drop (the record's created_at), and the local cloud
                # delivers the drops one listing finds in key order: the first two are taken before the rest, and
                # overnight before follow of its class, as drops a tick apart are
                wait_for(f"the launcher to take {name}", partial(reg.exists, ids[name]), 30, every=0.1)
        names = {job_id: name for name, job_id in ids.items()}
        first = ids["first-1"]

        def state(name: str) -> State | None:
            return reg.job(ids[name]).state if reg.exists(ids[name]) else None

        try:
            wait_for("the first two to run and the others to wait", lambda: [state(n) for n in EXPECTED] == [
                State.RUNNING] * 2 + [State.WAITING_CAPACITY] * 4, 90, every=0.5)
            waiting = json.loads(cli_ok(cloud, "queue", "--owner", OWNER, "--json"))["jobs"]
            in_use = "2 of 2 nodes in use (max_active_instances_per_owner)"
            line = f"of owner {OWNER!r} wait"
            assert [(names[w["id"]], w["position"], w["priority"], w["why"]) for w in waiting] == [
                ("urgent", 1, 100, f"owner {OWNER!r} has 2 active instances; 1 more would exceed the quota of 2 "
                                   "(max_active_instances_per_owner)"),
                ("plain", 2, 0, f"1 earlier job {line}s first ({ids['urgent']} next, priority 100); {in_use}"),
                ("overnight", 3, -10, f"2 earlier jobs {line} first ({ids['urgent']} next, priority 100); {in_use}"),
                ("follow", None, -10, f"dependency: waiting for {first} (RUNNING)")], waiting
            table = cli_ok(cloud, "queue").splitlines()  # a long why wraps onto lines of its own
            header = table.index(next(line for line in table if line.split()[:1] == ["POSITION"]))
            rows = [row.split()[:4] for row in table[header + 1:] if row.split()[:1] in (["1"], ["2"], ["3"], ["-"])]
            assert rows == [
                ["1", ids["urgent"], OWNER, "urgent"], ["2", ids["plain"], OWNER, "0"],
                ["3", ids["overnight"], OWNER, "batch"], ["-", ids["follow"], OWNER, "batch"]], table
        finally:
            gate.touch()
        wait_for("all 6 to end", lambda: all(state(n) in (State.SUCCEEDED, State.FAILED) for n in EXPECTED), 120,
                 every=0.5)
    assert {n: state(n) for n in EXPECTED} == dict.fromkeys(EXPECTED, State.SUCCEEDED)
    lives = {n: life(reg.events(ids[n])) for n in EXPECTED}
    # launched in the expected order; two one run launched (the check that ended both first jobs) share its time
    assert all(lives[a][0] <= lives[b][0] for a, b in itertools.pairwise(EXPECTED)), lives
    for name, (launched, _) in lives.items():
        live = [n for n, (start, end) in lives.items() if start <= launched < end]
        assert len(live) <= 2, f"{live} live when {name} launched: {lives}"
    assert lives["follow"][0] > lives["first-1"][1], "follow launched before first-1 SUCCEEDED"
    assert json.loads(cli_ok(cloud, "queue", "--owner", OWNER, "--json"))["jobs"] == []


def life(events: list[dict[str, Any]]) -> tuple[datetime, datetime]:
    """When a job's one attempt was launched (the write that recorded its VMs) and when it SUCCEEDED."""
    (launched,) = [e["time"] for e in events if e.get("to") == State.LAUNCHING and e.get("instances")]
    (ended,) = [e["time"] for e in events if e.get("to") == State.SUCCEEDED]
    return datetime.fromisoformat(launched), datetime.fromisoformat(ended)

