"""Registries the dashboard's tests (and its screenshots) look at, written as the functions and agents write them: a
finished job with checkpoints and artifacts, an array member, a Spot job preempted once with system samples across
both attempts, and many jobs for the Compare page."""

from __future__ import annotations

from datetime import timedelta

from jobplane.model import history, keys
from jobplane.model.metrics import Point
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.model.usage import AttemptUsage, InstanceSpan
from jobplane.store.registry import Registry
from tests.helpers import WRITTEN, data_of, ship, ship_system

SPEC = "name: {name}\ninstance_type: g5.xlarge\nrun: python train.py\nlabels: {{team: vision}}\n"
START = WRITTEN - timedelta(minutes=30)


def launched(reg: Registry, job_id: str, attempt: int, instances: list[str], market: str = "spot") -> None:
    at = START + timedelta(minutes=10 * (attempt - 1))
    usage = AttemptUsage(attempt=attempt, instance_type="g5.xlarge", market=market, zone="us-east-1a",
                         price=0.4, instances=[InstanceSpan(id=i, start=at) for i in instances])
    record = reg.job(job_id)
    reg.transition(job_id, State.LAUNCHING, expect=[record.state], attempt=attempt, instances=instances,
                   usage=[*record.usage, usage], now=at,
                   event=history.Launched(instances=instances, instance_type="g5.xlarge", zone="us-east-1a",
                                          image="ami-0demo", market=market, price=0.4, price_source="spot history"))
    reg.transition(job_id, State.RUNNING, expect=[State.LAUNCHING],
                   now=START + timedelta(minutes=10 * (attempt - 1), seconds=40))


def finished_with_files(reg: Registry, job_id: str = "resnet-0412") -> str:
    """A SUCCEEDED job with a falling loss over 11 steps, two checkpoints, a model and an output file."""
    reg.create_job(job_id, parse_spec(SPEC.format(name="resnet") + "tensorboard: {log_dir: /tmp/tb}\n", job_id),
                   now=START)
    launched(reg, job_id, 1, ["i-0a1b2c3d4e5f60718"], market="on-demand")
    ship(reg, job_id, 1, 0, 0, [p for step in range(11) for p in (Point("step", step, step),
                                                                   Point("loss", 2.0 * 0.8 ** step, step))])
    reg.transition(job_id, State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0",
                   now=START + timedelta(minutes=25))
    folder = data_of(reg, job_id)
    for name, size in (("files/0/00000001-a1/ckpt-5.pt", 40_000), ("files/0/00000002-a1/ckpt-10.pt", 40_000)):
        reg.store.put(reg.key(keys.checkpoints_prefix(folder) + name), b"c" * size)
    for name, size in (("model/model.safetensors", 120_000), ("output/metrics.csv", 900)):
        reg.store.put(reg.key(keys.artifacts_prefix(folder) + name), b"a" * size)
    return job_id


def array_member(reg: Registry, array: str = "shards", index: int = 2) -> str:
    job_id = f"{array}-{index}"
    spec = SPEC.format(name="shard") + f"array: {{size: 4, index: {index}}}\n"
    reg.create_job(job_id, parse_spec(spec.replace("{team: vision}", f"{{team: vision, array: {array}}}"), job_id),
                   now=START)
    launched(reg, job_id, 1, ["i-0feedfacecafe0001"])
    return job_id


def preempted_spot(reg: Registry, job_id: str = "spot-llm") -> str:
    """A Spot job preempted 4 minutes in, its second attempt running from 10 minutes: system samples every 15 s on
    each attempt (a network of a few KB/s), none in the gap between them."""
    reg.create_job(job_id, parse_spec(SPEC.format(name="llm") + "spot: true\nmax_restarts: 2\n", job_id), now=START)
    launched(reg, job_id, 1, ["i-0aaaa00000000001"])
    reg.transition(job_id, State.PREEMPTED, expect=[State.RUNNING], reason="spot interruption (terminate)",
                   now=START + timedelta(minutes=4))
    launched(reg, job_id, 2, ["i-0bbbb00000000002"])

    def samples(n: int, base: float) -> list[dict[str, float]]:
        return [{"cpu_percent": base + (i * 7) % 20, "memory_used_gb": 18.0 + i * 0.1, "memory_total_gb": 64.0,
                 "disk_used_gb": 40.0, "disk_total_gb": 200.0, "net_in_mb_s": 0.001 + 0.0004 * (i % 5),
                 "net_out_mb_s": 0.0006 + 0.0002 * (i % 3), "gpu0.utilization": base + 20 + (i * 11) % 30,
                 "gpu0.memory_used_gb": 14.0, "gpu0.memory_total_gb": 24.0, "gpu0.power_w": 180.0 + i}
                for i in range(n)]

    ship_system(reg, job_id, 1, 0, 0, samples(12, 40.0), first=-30 * 60 + 60)  # 1 to 4 minutes after START
    ship_system(reg, job_id, 2, 0, 0, samples(24, 50.0), first=-30 * 60 + 11 * 60)  # from 11 minutes
    ship(reg, job_id, 1, 0, 0, [Point("loss", 3.0 - 0.1 * s, s) for s in range(0, 8)])
    ship(reg, job_id, 2, 0, 0, [Point("loss", 2.4 - 0.1 * s, s) for s in range(5, 16)])
    reg.transition(job_id, State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0",
                   now=START + timedelta(minutes=17))
    return job_id
