"""`jobplane sweep ls | describe | cancel`, `jobplane ls` grouping a sweep's trials (and an array's members, which
`jobplane cancel` cancels as one), and `jobplane cost --by label:sweep`, through click on both clouds
(tests/registry_clouds.py). The CLI submits the sweep's spec; the launcher (the real one) records it and drops its
first trials; the trials then run as test_cli_jobs' jobs do: records written as the launcher and the sweeper write
them, with a price, so each has a cost."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from jobplane import sdk
from jobplane.clouds.memory import MemoryCompute
from jobplane.control import launcher
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.model import drops, keys
from jobplane.model.clock import utcnow
from jobplane.model.states import State
from jobplane.model.usage import AttemptUsage, InstanceSpan
from jobplane.sdk import Client
from jobplane.store.registry import Registry
from jobplane.sweeps import ops, store
from jobplane.views import cost
from tests.cli.helpers import run
from tests.helpers import falling, ship
from tests.registry_clouds import RegistryCloud

pytestmark = pytest.mark.timeout(120)
SWEEP = ("sweep:\n  parameters:\n    lr: {loguniform: [0.0001, 0.1]}\n    batch: {choice: [32, 64]}\n"
         "  max_trials: 5\n  max_parallel: 2\n  objective: {metric: loss, goal: minimize}\n  seed: 3\n")


def accepted(cloud: RegistryCloud, sweep_id: str, kind: str = "sweep") -> None:
    """The launcher takes the sweep's drop (or the array's): it is recorded and its first trials dropped."""
    region = "us-central1" if cloud.name == "gcp" else "us-east-1"
    ctx = Context(cloud.reg, MemoryCompute(cloud=cloud.name, region=region), cloud.reg.policy(), CountingMetrics())
    assert launcher.handle_drop(ctx, keys.queue_entry(sweep_id), now=utcnow()).result == kind


def running(reg: Registry, job_id: str, price: float) -> None:
    """The launcher takes the trial's drop and launches it an hour ago at `price` an hour; it runs."""
    key = keys.queue_entry(job_id)
    drop = keys.parse_drop(key)
    assert drop is not None
    reg.create_job(job_id, drops.read_spec(drop, reg.get_bytes(key)))
    reg.delete(key)
    started = utcnow() - timedelta(hours=1)
    usage = AttemptUsage(attempt=1, instance_type="t3.micro", market="spot", price=price, price_source="policy",
                         instances=[InstanceSpan(id=f"i-{job_id}", start=started)])
    reg.transition(job_id, State.LAUNCHING, expect={State.QUEUED}, attempt=1, instances=[f"i-{job_id}"],
                   usage=[usage])
    reg.transition(job_id, State.RUNNING)


def test_a_sweep_is_listed_described_costed_and_cancelled(registry_cloud: RegistryCloud, reg: Registry,
                                                          tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(registry_cloud.spec(SWEEP))
    submitted = run("submit", str(spec), "--id", "lr")
    assert submitted.exit_code == 0, submitted.output
    assert submitted.stdout == "lr\n" and "jobplane sweep describe lr" in submitted.stderr
    assert run("submit", str(spec), "--id", "lr2", "-f").exit_code == 1  # a sweep is not followed as a job
    accepted(registry_cloud, "lr")
    running(reg, "lr-t001", 0.5)
    running(reg, "lr-t002", 0.25)
    ship(reg, "lr-t001", 1, 0, 0, falling(range(10, 40, 10)))  # loss 8 * 0.97^step; the last at step 30

    rows = json.loads(run("ls", "--json").stdout)
    assert [(r["id"], r["state"], r["trials"]) for r in rows] == [("lr", "SWEEP", 2)]
    assert rows[0]["cost"] == pytest.approx(0.75, rel=0.01) and "2 RUNNING" in rows[0]["reason"]
    assert sorted(r["id"] for r in json.loads(run("ls", "--trials", "--json").stdout)) == ["lr-t001", "lr-t002"]
    assert "SWEEP" in run("ls").stdout

    swept = json.loads(run("sweep", "ls", "--json").stdout)
    assert [(s["id"], s["state"], s["trials"], s["max_trials"]) for s in swept] == [("lr", "RUNNING", 2, 5)]
    assert "lr" in run("sweep", "ls").stdout

    described = json.loads(run("sweep", "describe", "lr", "--json").stdout)
    assert described["sweep"]["state"] == "RUNNING"
    assert [t["job_id"] for t in described["trials"]] == ["lr-t001", "lr-t002"]
    first = described["trials"][0]
    assert first["objective"] == pytest.approx(8 * 0.97 ** 30) and not first["final"]
    assert set(first["params"]) == {"lr", "batch"} and first["state"] == "RUNNING"
    assert described["cost"]["usd"] == pytest.approx(0.75, rel=0.01) and described["cost"]["basis"] == "estimated"
    table = run("sweep", "describe", "lr")
    assert table.exit_code == 0, table.output
    assert "lr-t001" in table.stdout and "LOSS" in table.stdout and "BATCH" in table.stdout
    assert cost.money(cost.Cost(usd=described["cost"]["usd"])) in table.stdout

    by_sweep = json.loads(run("cost", "--by", "label:sweep", "--json").stdout)
    assert [(r["label:sweep"], r["jobs"]) for r in by_sweep] == [("lr", 2)]
    assert by_sweep[0]["usd"] == pytest.approx(0.75, rel=0.01)

    cancelled = run("sweep", "cancel", "lr")
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout == "lr CANCELLED (2 trials proposed)\n"
    assert [reg.job(j).state for j in ("lr-t001", "lr-t002")] == [State.CANCELLED, State.CANCELLED]
    assert store.get(reg, "lr")[0].state == "CANCELLED" and store.live(reg) == []
    again = run("sweep", "cancel", "lr")
    assert again.exit_code == 1 and "already CANCELLED" in again.output
    assert json.loads(run("sweep", "ls", "--json").stdout) == []
    ended = run("ls", "--trials")  # the trials ended with the sweep: an empty table, and where they are
    assert ended.exit_code == 0 and ended.stderr == "no live jobs or trials: --all lists the ended ones too\n"
    assert "lr-t001" in run("ls", "--trials", "--all").stdout
    assert [s["id"] for s in json.loads(run("sweep", "ls", "--all", "--json").stdout)] == ["lr"]


def test_an_array_is_one_line_in_ls_and_cancelled_as_one(registry_cloud: RegistryCloud, reg: Registry,
                                                          tmp_path: Path) -> None:
    spec = tmp_path / "array.yaml"
    spec.write_text(registry_cloud.spec("array: {size: 5, max_parallel: 2}\n"))
    submitted = run("submit", str(spec), "--id", "arr")
    assert submitted.exit_code == 0, submitted.output
    assert submitted.stdout == "arr\n" and "its members are arr-0, arr-1, ..." in submitted.stderr
    assert run("submit", str(spec), "--id", "arr2", "-f").exit_code == 1  # an array is not followed as a job
    accepted(registry_cloud, "arr", kind="array")
    running(reg, "arr-0", 0.5)
    running(reg, "arr-1", 0.25)

    rows = json.loads(run("ls", "--json").stdout)
    assert [(r["id"], r["state"], r["members"]) for r in rows] == [("arr", "ARRAY", 2)]
    assert rows[0]["cost"] == pytest.approx(0.75, rel=0.01) and "2 RUNNING" in rows[0]["reason"]
    assert "jobplane cancel arr cancels them" in rows[0]["reason"] and "ARRAY" in run("ls").stdout
    assert sorted(r["id"] for r in json.loads(run("ls", "--trials", "--json").stdout)) == ["arr-0", "arr-1"]
    assert json.loads(run("sweep", "ls", "--json").stdout) == []  # sweeps alone
    assert "no sweep 'arr' (arr is an array)" in run("sweep", "describe", "arr").output

    cancelled = run("cancel", "arr")
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout == "arr CANCELLED (an array: its 2 members dropped so far, each not ended cancelled)\n"
    assert [reg.job(j).state for j in ("arr-0", "arr-1")] == [State.CANCELLED, State.CANCELLED]
    assert store.get(reg, "arr")[0].state == "CANCELLED" and store.live(reg) == []
    again = run("cancel", "arr")
    assert again.exit_code == 1 and "already CANCELLED" in again.output
    unknown = run("cancel", "nope")
    assert unknown.exit_code == 1 and "no job 'nope'" in unknown.output


def test_an_unknown_sweep_is_one_clear_error(reg: Registry) -> None:
    for command in (["sweep", "describe", "nope"], ["sweep", "cancel", "nope"]):
        result = run(*command)
        assert result.exit_code == 1 and "no sweep 'nope'" in result.output, (command, result.output)


def test_a_sweep_just_submitted_is_waited_for_or_said_to_be_still_in_queue(registry_cloud: RegistryCloud, reg: Registry,
                                                                           tmp_path: Path) -> None:
    """Before the launcher records it (seconds after the submit) a sweep is a drop in queue/: `sweep describe`
    and Client.sweep say so instead of "no sweep", and Client.sweep(id, wait=...) waits for it."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(registry_cloud.spec(SWEEP))
    assert run("submit", str(spec), "--id", "lr").exit_code == 0
    described = run("sweep", "describe", "lr")
    assert described.exit_code == 1
    assert "no sweep 'lr' yet: its spec is still in queue/, and the launcher records it within seconds" in \
        described.output
    with pytest.raises(sdk.SweepNotFound) as caught:
        Client().sweep("lr")
    assert caught.value.queued
    looks: list[float] = []

    def launcher_meanwhile(seconds: float) -> None:  # the wait's pause: the launcher takes the drop then
        looks.append(seconds)
        accepted(registry_cloud, "lr")

    assert ops.find(reg, "lr", wait=60, interval=2, sleep=launcher_meanwhile).state == "RUNNING" and looks == [2]
    assert Client().sweep("lr", wait=60).id == "lr"
    with pytest.raises(sdk.SweepNotFound, match=r"^no sweep 'lr-t001' \(lr-t001 is a job, not a sweep\)$"):
        Client().sweep("lr-t001", wait=60)  # a trial's drop: a job's, never waited for
    reg.put_json(keys.rejected_error("bad"), {"reason": "sweep.max_trials: above the policy's 50"})
    with pytest.raises(sdk.SweepNotFound, match=r"\(its spec was rejected: sweep.max_trials: above the policy's 50\)"):
        Client().sweep("bad", wait=60)
