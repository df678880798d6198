"""The queue told truthfully (issue 58), through click over a day on the manual clock (tests/control/reconcile/day.py:
MemoryStore, MemoryCompute, the real launcher and sweeper), the commands given an SDK client of that registry:
`submit` refuses at once, naming the field, what the launcher would refuse by the policy in force (a priority class
unknown or not the owner's, an `after:` naming nothing, an array or a job that can never fit, an owner at its budget
when the policy refuses past it), uploading and dropping nothing; `--priority` sets the class; `jobplane policy`
prints the policy in force (and --json); `jobplane queue` starts with each owner's usage, the deployment's cap and
each family's, and names priorities by class; an array is first-class in `ls` (its size, its members by state, those
not dropped yet too, its end state), `describe` and `queue`. On main, `submit` exited 0 for each of these specs, there
was no `policy`, `queue` showed no usage and numbers for priorities, and `describe <array>` said "no job"."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from jobplane import sdk
from jobplane.cli import cli
from jobplane.cli import jobs as cli_jobs
from jobplane.cli import queue as cli_queue
from jobplane.cli import sweeps as cli_sweeps
from jobplane.control import launcher
from jobplane.model import keys
from jobplane.model.admission import AdmissionRecord
from jobplane.model.policy import parse_policy
from jobplane.model.states import State
from jobplane.ops.jobs import Backend
from jobplane.settings import Settings
from jobplane.sweeps import ops
from tests.control.reconcile.day import Day
from tests.sweeps.helpers import launch_drops, start

pytestmark = pytest.mark.timeout(60)
Run = Callable[..., Result]
POLICY = """\
max_active_instances_per_owner: 2
max_active_instances: 3
max_active_by_family: {t3: 4}
owner_weights: {team-a: 2}
priority_classes:
  urgent: {value: 100, owners: [team-a]}
  batch: {value: -10}
budgets: {monthly_usd: {team-b: 10, team-c: 50}, on_exceeded: refuse}
"""


@pytest.fixture
def uploads() -> list[str]:
    return []


@pytest.fixture
def client(day: Day, uploads: list[str]) -> sdk.Client:
    """An SDK client of the day's registry (code uploads recorded)."""
    return sdk.Client.from_settings(Settings(bucket="memory"), connected=Backend(
        day.reg, "s3://memory", lambda: day.compute, lambda key, path: uploads.append(key)))


@pytest.fixture
def run(day: Day, client: sdk.Client, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """`jobplane ARGS` through click, its commands on the SDK client of the day's registry, under POLICY."""
    for module in (cli_jobs, cli_queue, cli_sweeps):
        monkeypatch.setattr(module, "client", lambda **conn: client)
    day.reg.put(keys.POLICY, POLICY.encode())
    yield lambda *args: CliRunner().invoke(cli, [str(a) for a in args])


def spec(tmp_path: Path, name: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nrun: python3 train.py\ninstance_type: t3.micro\n{extra}")
    return path


def at_budget(day: Day, owner: str, usd: float) -> None:
    """The owner's admission record: `usd` spent this (real) month, as the releases of its ended attempts charge it."""
    record = AdmissionRecord().charged(owner, usd, datetime.now(UTC))
    day.reg.put(keys.admission_owner(owner), record.model_dump_json().encode())


def drop(day: Day, owner: str, job_id: str, extra: str = "") -> launcher.Result:
    """An owner's drop and the launcher's run on its event."""
    key = keys.queue_entry(job_id, owner)
    day.store.put(day.reg.key(key), f"run: python3 train.py\ninstance_type: t3.micro\n{extra}".encode())
    return launcher.handle_drop(day.context(), key, now=day.clock()).result


def queued(day: Day) -> list[str]:
    return [key for key, _, _ in day.reg.listing(keys.QUEUE)]


# ---- submit checks the policy in force ---------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "owner", "error"), [
    pytest.param("priority: nope\n", "team-a",
                 "priority: 'nope' is not a priority class of this platform (batch, urgent)", id="unknown class"),
    pytest.param("priority: urgent\n", "team-c",
                 "priority: owner 'team-c' may not use priority class 'urgent' (its owners: team-a)",
                 id="a class not the owner's"),
    pytest.param("after: [prep, afterany:nobody]\n", "team-a",
                 "after[1]: no job or array 'nobody': submit what this one waits for first", id="unknown after"),
    pytest.param("array: {size: 8, max_parallel: 3}\n", "team-a",
                 "array.max_parallel: 3 members of 1 node(s) at once can never fit the owner quota of 2 active "
                 "instances", id="an array that can never fit"),
    pytest.param("num_nodes: 4\n", "team-a",
                 "num_nodes: 4 nodes can never fit the owner quota of 2 active instances", id="a job that never fits"),
    pytest.param("", "team-b", "owner: budget: $12.00 of $10.00 this month for team-b (budgets.monthly_usd): a new "
                               "job of team-b is refused until the month turns (budgets.on_exceeded: refuse)",
                 id="an owner at its budget"),
])
def test_submit_refuses_what_the_policy_in_force_would_naming_the_field(
        day: Day, run: Run, uploads: list[str], tmp_path: Path, extra: str, owner: str, error: str) -> None:
    at_budget(day, "team-b", 12.0)
    drop(day, "team-a", "prep")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    done = run("submit", spec(tmp_path, "job", extra), "--owner", owner, "--code", code, "--id", "job")
    assert done.exit_code == 1, done.output
    assert error in done.stderr, done.stderr
    assert uploads == [] and queued(day) == [] and not day.reg.exists("job")  # nothing uploaded, nothing dropped


def test_the_sdk_refuses_the_same_with_every_field_named(day: Day, run: Run, client: sdk.Client,
                                                         uploads: list[str], tmp_path: Path) -> None:
    at_budget(day, "team-b", 12.0)
    code = tmp_path / "code"
    code.mkdir()
    with pytest.raises(sdk.InvalidSpec) as refused:
        client.submit(spec(tmp_path, "job", "priority: urgent\nafter: [nobody]\nnum_nodes: 3\n"), owner="team-b",
                      code=code)
    assert [e.path for e in refused.value.errors] == ["num_nodes", "priority", "after[0]", "owner"]
    assert uploads == [] and queued(day) == []
    assert client.policy().priority_classes["urgent"].owners == ["team-a"]
    assert client.submit(spec(tmp_path, "ok"), owner="team-a", priority="urgent").view.spec.priority == "urgent"


def test_submit_takes_an_array_a_queued_drop_and_an_owner_under_its_budget(day: Day, run: Run,
                                                                         tmp_path: Path) -> None:
    at_budget(day, "team-c", 12.0)  # of 50
    assert drop(day, "team-a", "shards", "array: {size: 2}\n") == launcher.Result.ARRAY
    day.reg.put(keys.queue_entry("prep", "team-a"), b"run: x\ninstance_type: t3.micro\n")  # not taken yet
    done = run("submit", spec(tmp_path, "merge", "after: [shards, afternotok:prep]\n"), "--owner", "team-c",
               "--id", "merge")
    assert done.exit_code == 0, done.output
    assert keys.queue_entry("merge", "team-c") in queued(day)


def test_priority_sets_the_class_over_the_specs_and_shows_by_name(day: Day, run: Run, tmp_path: Path) -> None:
    done = run("submit", spec(tmp_path, "rush", "priority: batch\n"), "--owner", "team-a", "--priority", "urgent",
               "--id", "rush")
    assert done.exit_code == 0, done.output
    assert b"priority: urgent" in day.reg.get_bytes(keys.queue_entry("rush", "team-a"))
    refused = run("submit", spec(tmp_path, "other"), "--owner", "team-b", "-p", "urgent")
    assert refused.exit_code == 1 and "priority: owner 'team-b' may not use priority class 'urgent'" in refused.stderr
    day.backstop()  # the launcher takes the drop
    assert "priority urgent" in " ".join(run("describe", "rush").stdout.split())
    with pytest.raises(sdk.InvalidSpec, match="priority: 'Not A Name' is not a valid priority class"):
        sdk.prepare(spec(tmp_path, "x"), priority="Not A Name")  # a name's shape; the client checks the policy
    assert sdk.prepare(spec(tmp_path, "y", "priority: urgent\n"), priority="batch").doc["priority"] == "batch"


# ---- the policy in force -----------------------------------------------------------------------------------------
def test_policy_prints_the_policy_in_force_and_json(day: Day, run: Run) -> None:
    text = run("policy")
    assert text.exit_code == 0, text.output
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in text.stdout.splitlines()[2:] if line.strip()}
    assert "config/policy.yaml, with the defaults where it sets nothing" in text.stdout.splitlines()[0]
    assert rows["max_active_instances_per_owner"] == "2" and rows["max_active_instances"] == "3"
    assert rows["max_active_by_family.t3"] == "4" and rows["owner_weights.team-a"] == "2"
    assert rows["priority_classes.urgent"] == "100 (owners: team-a)"
    assert rows["priority_classes.batch"] == "-10 (owners: every owner)"
    assert rows["budgets.monthly_usd.team-b"] == "$10.00 a month" and rows["budgets.on_exceeded"] == "refuse"
    assert (rows["default_max_cost"], rows["max_cost_ceiling"], rows["budgets.on_exceeded_by_owner"]) == (
        "unset", "unset", "none")
    capped = dict(cli_queue.policy_rows(parse_policy("default_max_cost: 25\nmax_cost_ceiling: 1000\n"
                                                     "budgets: {on_exceeded_by_owner: {team-b: wait}}\n")))
    assert (capped["default_max_cost"], capped["max_cost_ceiling"], capped["budgets.on_exceeded_by_owner.team-b"]) \
        == ("$25.00 a job", "$1,000.00 a job", "wait")
    assert rows["default_max_runtime"] == "1d" and rows["aws.default_image"] == "unset"
    assert rows["allowed_instance_types"] == "*" and rows["access.ssh"] == "no"
    as_json = json.loads(run("policy", "--json").stdout)
    assert as_json["policy"]["priority_classes"]["urgent"] == {"value": 100, "owners": ["team-a"]}
    assert as_json["policy"]["max_active_instances"] == 3 and as_json["registry"] == "s3://memory"
    day.reg.delete(keys.POLICY)
    assert "the defaults: config/policy.yaml is absent" in run("policy").stdout


# ---- who uses what -----------------------------------------------------------------------------------------------
def test_queue_starts_with_each_owners_usage_and_names_priorities_by_class(day: Day, run: Run) -> None:
    for owner, job_id, extra in (("team-a", "a1", ""), ("team-a", "a2", ""), ("team-b", "b1", ""),
                                 ("team-a", "a3", "priority: urgent\n"), ("team-b", "b2", "priority: batch\n")):
        drop(day, owner, job_id, extra)
    assert [day.job(j).state for j in ("a1", "a2", "b1", "a3", "b2")] == [State.LAUNCHING] * 3 + [
        State.WAITING_CAPACITY] * 2
    found = json.loads(run("queue", "--json").stdout)
    owners = {o["owner"]: o for o in found["usage"]["owners"]}
    assert sorted(owners) == ["team-a", "team-b", "team-c"]  # team-c: a budget in the policy, nothing in use
    assert (owners["team-a"]["in_use"], owners["team-a"]["quota"], owners["team-a"]["waiting"],
            owners["team-a"]["weight"], owners["team-a"]["fair_share"]) == (2, 2, 1, 2.0, 2.0)  # 3 x 2 / (2 + 1)
    assert (owners["team-b"]["in_use"], owners["team-b"]["waiting"], owners["team-b"]["fair_share"]) == (1, 1, 1.0)
    assert owners["team-a"]["budget"] is None and owners["team-b"]["budget"]["budget_usd"] == 10
    assert found["usage"]["deployment"] == {"name": "deployment", "field": "max_active_instances", "in_use": 3,
                                            "limit": 3}
    assert found["usage"]["families"] == [{"name": "t3", "field": "max_active_by_family.t3", "in_use": 3,
                                           "limit": 4}]
    assert [(j["id"], j["priority"], j["priority_class"]) for j in found["jobs"]] == [
        ("a3", 100, "urgent"), ("b2", -10, "batch")]
    table = run("queue")
    lines = [" ".join(line.split()) for line in table.stdout.splitlines()]
    assert lines[0] == "usage" and lines[1].startswith("OWNER NODES IN USE WAITING WEIGHT FAIR SHARE")
    assert any(line.startswith("team-a 2 of 2 1 2 2 of 3 -") for line in lines), lines
    assert any(line.startswith("team-b 1 of 2 1 1 1 of 3 $0.") and "of $10.00 this month" in line for line in lines)
    assert "deployment cap: 3 of 3 nodes in use (max_active_instances)" in lines
    assert "family t3: 3 of 4 nodes in use (max_active_by_family.t3)" in lines
    assert any(line.startswith("1 a3 team-a urgent 1 ") for line in lines), lines
    assert any(line.startswith("1 b2 team-b batch 1 ") for line in lines), lines
    assert " 0d " not in " ".join(lines)  # a wait just begun reads 0s
    one = json.loads(run("queue", "--owner", "team-b", "--json").stdout)
    assert [o["owner"] for o in one["usage"]["owners"]] == ["team-b"] and [j["id"] for j in one["jobs"]] == ["b2"]


def test_queue_marks_an_owner_over_its_budget_with_what_happens_to_its_jobs(day: Day, run: Run) -> None:
    at_budget(day, "team-b", 12.0)
    table = run("queue", "--owner", "team-b")
    text = " ".join(table.stdout.split())
    assert "team-b" in text and "OVER $12.00 of $10.00 this month (120%): new jobs refused until" in text, text
    assert "jobs that ran go on" in text
    under = " ".join(run("queue", "--owner", "team-c").stdout.split())
    assert "OVER" not in under and "$0.00 of $50.00 this month (0%)" in under


# ---- arrays, first-class ------------------------------------------------------------------------------------------
def members_run(day: Day, array_id: str, codes: list[int], first: int = 0) -> None:
    """Each member in turn from index `first`: the launcher takes its drop, it runs, exits with its code, and the
    sweeper's pass (the array's reconcile) drops the next."""
    for index, code in enumerate(codes, start=first):
        launch_drops(day)
        job_id = f"{array_id}-{index}"
        if day.job(job_id).state == State.LAUNCHING:
            start(day, job_id)
        day.exits(job_id, 0, code)
        day.sweeper(jobs=[job_id])


def test_an_array_shows_its_size_counts_and_end_in_ls_describe_and_queue(day: Day, run: Run, tmp_path: Path) -> None:
    day.reg.delete(keys.POLICY)  # the default quotas
    assert run("submit", spec(tmp_path, "arr", "array: {size: 8, max_parallel: 2}\n"), "--id", "arr").exit_code == 0
    day.backstop()  # the launcher records the array and drops its first members
    assert launch_drops(day) == ["arr-0", "arr-1"]
    start(day, "arr-0", "arr-1")

    (row,) = json.loads(run("ls", "--json").stdout)
    assert (row["id"], row["state"], row["size"], row["counts"]) == ("arr", "ARRAY", 8, {"RUNNING": 2,
                                                                                        "NOT_DROPPED": 6})
    assert row["reason"].startswith("array of 8: 2 RUNNING, 6 not dropped yet (jobplane describe arr")
    (waiting,) = json.loads(run("queue", "--json").stdout)["jobs"]
    assert (waiting["id"], waiting["position"], waiting["array"]) == ("arr", None, {"size": 8, "not_dropped": 6})
    assert waiting["why"] == ("array: 6 of 8 members not dropped yet; it drops the next as one ends, at most 2 at "
                              "once (array.max_parallel)")
    described = " ".join(run("describe", "arr").stdout.split())
    assert "state RUNNING" in described and "size 8 members, at most 2 at once, 1 node(s) each" in described
    assert "members 2 RUNNING, 6 not dropped yet: the array drops the next as one ends" in described
    assert "0 arr-0 RUNNING" in described and "1 arr-1 RUNNING" in described
    as_json = json.loads(run("describe", "arr", "--json").stdout)
    assert (as_json["size"], as_json["counts"]) == (8, {"RUNNING": 2, "NOT_DROPPED": 6})
    assert [(m["index"], m["job_id"], m["state"]) for m in as_json["members"]] == [(0, "arr-0", "RUNNING"),
                                                                                 (1, "arr-1", "RUNNING")]

    for job_id in ("arr-0", "arr-1"):
        day.exits(job_id, 0, 0)
    day.sweeper(jobs=["arr-0", "arr-1"])
    (row,) = json.loads(run("ls", "--json").stdout)  # 2 ended, 2 dropped (QUEUED), 4 not dropped yet
    assert row["counts"] == {"QUEUED": 2, "SUCCEEDED": 2, "NOT_DROPPED": 4}
    members_run(day, "arr", [0] * 6, first=2)
    assert ops.records_one(day.reg, "arr", array=True).state == "COMPLETED"
    assert json.loads(run("ls", "--json").stdout) == []  # ended: only with --all
    (row,) = json.loads(run("ls", "--all", "--json").stdout)
    assert (row["state"], row["size"], row["counts"]) == ("COMPLETED", 8, {"SUCCEEDED": 8})
    assert row["reason"] == "array of 8: 8 SUCCEEDED (jobplane describe arr)"
    assert "state COMPLETED: 8 members: 8 SUCCEEDED" in " ".join(run("describe", "arr").stdout.split())
    assert json.loads(run("queue", "--json").stdout)["jobs"] == []


def test_an_array_ends_failed_or_cancelled_in_ls(day: Day, run: Run, tmp_path: Path) -> None:
    day.reg.delete(keys.POLICY)
    for array_id in ("bad", "gone"):
        assert run("submit", spec(tmp_path, array_id, "array: {size: 3, max_parallel: 1}\n"), "--id",
                   array_id).exit_code == 0
    day.backstop()
    members_run(day, "bad", [0, 2, 0])
    cancelled = run("cancel", "gone")
    assert cancelled.exit_code == 0, cancelled.output
    rows = {r["id"]: r for r in json.loads(run("ls", "--all", "--json").stdout)}
    assert (rows["bad"]["state"], rows["bad"]["counts"]) == ("FAILED", {"SUCCEEDED": 2, "FAILED": 1})
    assert (rows["gone"]["state"], rows["gone"]["counts"]) == ("CANCELLED", {"CANCELLED": 1, "NOT_DROPPED": 2})
    table = run("ls", "--all").stdout
    assert "FAILED" in table and "CANCELLED" in table and "ARRAY" not in table
    assert "no job 'nope'" in run("describe", "nope").stderr
    day.reg.put(keys.sweep_record("broken"), b"{not json")  # the sweeper's runs report it; ls and queue go on
    day.reg.put(keys.active_sweep("broken"), b"")
    assert run("ls", "--json").exit_code == 0 and run("queue", "--json").exit_code == 0
