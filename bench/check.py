"""Check cost at scale: API calls and time of one check over N healthy RUNNING jobs, against a naive loop.

Seeds N healthy jobs in moto (in-process S3 + EC2): job.json, the RUNNING active/ marker (its name carrying the
attempt's limits, as the check writes it when the job starts), a heartbeat and an output mark, and one tagged,
running instance each. Then runs one real
`reconcile.check` and a naive baseline (list the live jobs, GET every job.json, describe the instances:
the status loop most DIY controllers run), counting every S3 and EC2 call by operation with botocore
event hooks.

    .venv/bin/python bench/check.py               # N = 100, 1000, 5000
    .venv/bin/python bench/check.py --n 100 1000

Writes bench/results/check.json (kept: docs/benchmarks.md's table is made from it by bench/render.py), with the
load average before and after, and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

for _var, _val in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_var, _val)
os.environ.pop("AWS_ENDPOINT_URL", None)  # in-process moto only: never a real endpoint

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402
from moto.core import DEFAULT_ACCOUNT_ID  # noqa: E402
from moto.ec2.models import ec2_backends  # noqa: E402
from moto.s3.models import s3_backends  # noqa: E402

from jobplane.clouds.aws import Ec2Compute  # noqa: E402
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED  # noqa: E402
from jobplane.clouds.s3 import S3Store  # noqa: E402
from jobplane.control import reconcile  # noqa: E402
from jobplane.decide.model import Limits  # noqa: E402
from jobplane.deployment.context import Context  # noqa: E402
from jobplane.deployment.telemetry import CountingMetrics  # noqa: E402
from jobplane.model import keys  # noqa: E402
from jobplane.model.jobrecord import JobRecord  # noqa: E402
from jobplane.model.policy import DEFAULT_POLICY  # noqa: E402
from jobplane.model.spec import JobSpec  # noqa: E402
from jobplane.model.states import State  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

BUCKET = "jobplane-bench"
REGION = "us-east-1"
BATCH = 500  # instances per RunInstances (one reservation)


class CallCounter:
    """Counts API calls by service.operation, and the time spent inside them per service, via botocore's
    before-call / after-call events (single-threaded use)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.job_record_gets = 0
        self.list_pages: Counter[str] = Counter()  # ListObjectsV2 pages by prefix
        self._started = 0.0

    def before(self, model: Any, params: dict[str, Any] | None = None, **_: Any) -> None:
        self.calls[f"{model.service_model.service_name}.{model.name}"] += 1
        if model.name == "GetObject" and str((params or {}).get("url_path", "")).endswith("/job.json"):
            self.job_record_gets += 1
        if model.name == "ListObjectsV2":
            self.list_pages[str((params or {}).get("query_string", {}).get("prefix", ""))] += 1
        self._started = time.monotonic()

    def after(self, model: Any, **_: Any) -> None:
        self.seconds[model.service_model.service_name] += time.monotonic() - self._started

    def hooks(self, client: Any) -> list[tuple[str, Any]]:
        service = client.meta.service_model.service_name
        return [(f"before-call.{service}", self.before), (f"after-call.{service}", self.after)]

    def attach(self, *clients: Any) -> None:
        for client in clients:
            for event, hook in self.hooks(client):
                client.meta.events.register(event, hook)

    def detach(self, *clients: Any) -> None:
        for client in clients:
            for event, hook in self.hooks(client):
                client.meta.events.unregister(event, hook)


def seed(reg: Registry, ec2: Any, image: str, n: int) -> None:
    """Seed through moto's backends (the wire format of tens of thousands of seeding calls would dominate
    the run); only the instances' RunInstances go through boto3. What is measured goes through boto3."""
    now = datetime.now(UTC)
    spec = JobSpec(run="python3 train.py", instance_type="t3.micro")
    bucket = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    tags = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]

    def put(key: str, body: bytes = b"") -> None:
        bucket.put_object(BUCKET, reg.key(key), body)

    ids: list[str] = []
    for start in range(0, n, BATCH):
        count = min(BATCH, n - start)
        resp = ec2.run_instances(ImageId=image, MinCount=count, MaxCount=count, InstanceType="t3.micro",
                                 TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                     {"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_ATTEMPT, "Value": "1"}]}])
        ids += [i["InstanceId"] for i in resp["Instances"]]
    beat = json.dumps({"time": now.isoformat()}).encode()
    for i, iid in enumerate(ids):
        job_id = f"job-{i:05d}"
        tags.create_tags([iid], {TAG_JOB_ID: job_id})
        limits = Limits(job_id, 1, 1, DEFAULT_POLICY.stall_timeout(spec), DEFAULT_POLICY.max_runtime(spec)).tail
        record = JobRecord(id=job_id, spec=spec.model_copy(update={"id": job_id}), state=State.RUNNING, attempt=1,
                           created_at=now, updated_at=now, state_since=now, launched_at=now, instances=[iid],
                           limits=limits)
        put(keys.job_record(job_id), record.model_dump_json(exclude_none=True).encode())
        put(record.marker)
        put(keys.heartbeat(job_id, 1, 0), beat)
        put(keys.output_mark(job_id, 1, 0), beat)


def naive(reg: Registry, compute: Ec2Compute) -> int:
    """The baseline: every live job's record, every check."""
    records = [reg.job(job_id) for job_id in reg.active()]
    compute.list_managed()
    return len(records)


def measure(n: int) -> dict[str, Any]:
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        ec2 = boto3.client("ec2", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        reg = Registry(S3Store(BUCKET, s3))
        compute = Ec2Compute(DEFAULT_POLICY.aws, REGION, ec2)
        started = time.monotonic()
        seed(reg, ec2, image, n)
        seeded = time.monotonic() - started

        out: dict[str, Any] = {"n": n, "seed_seconds": round(seeded, 1)}
        for name, run in (
            ("check", lambda: reconcile.check(Context(reg, compute, reg.policy(), CountingMetrics()),
                                              now=datetime.now(UTC))),
            ("naive", lambda: naive(reg, compute)),
        ):
            counter = CallCounter()
            counter.attach(s3, ec2)
            t0 = time.monotonic()
            result = run()
            elapsed = time.monotonic() - t0
            counter.detach(s3, ec2)
            calls = dict(sorted(counter.calls.items()))
            out[name] = {"seconds": round(elapsed, 2), "s3_seconds": round(counter.seconds["s3"], 2),
                         "ec2_seconds": round(counter.seconds["ec2"], 2), "calls": calls,
                         "total_calls": sum(calls.values()),
                         "get_object": calls.get("s3.GetObject", 0), "job_record_gets": counter.job_record_gets,
                         "list_pages": dict(sorted(counter.list_pages.items()))}
            if name == "check":
                out[name]["actions"] = len(result) if isinstance(result, list) else None
        out["job_record_gets_per_healthy_job"] = out["check"]["job_record_gets"] / n
        out["call_ratio_naive_over_check"] = round(out["naive"]["total_calls"] / out["check"]["total_calls"], 1)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "check.json")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    results = []
    for n in args.n:
        results.append(measure(n))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "check", "measured_at": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(),
           "load_average_before": [round(x, 2) for x in load_before],
           "load_average_after": [round(x, 2) for x in os.getloadavg()], "results": results}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
