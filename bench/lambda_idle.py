"""Idle cost inputs: how long each Lambda handler runs on its cron, and what it calls, against moto.

Invokes the four real handlers (functions/aws/*.handler) in-process with the "Scheduled Event" their
schedules deliver, against in-process moto (S3 + EC2), for an empty registry ("idle") and a small one (3
healthy RUNNING jobs with instances, heartbeats and limits). Per handler: median and p90 wall time of 20
warm invocations, API calls by operation, bytes printed (log + EMF lines = CloudWatch Logs ingestion),
metric names emitted; plus the cold import time of each handler module in a fresh interpreter.

moto answers in microseconds where S3 and EC2 take tens of milliseconds: the README's cost arithmetic
adds a per-call latency to the measured durations and says so.

    .venv/bin/python bench/lambda_idle.py        # writes bench/results/lambda_idle.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import check as check_bench  # noqa: E402  (bench/check.py: seeding and the API-call counter)
import report  # noqa: E402

os.environ.update({"JOBPLANE_BUCKET": check_bench.BUCKET, "AWS_REGION": check_bench.REGION,
                   "POWERTOOLS_SERVICE_NAME": "jobplane", "POWERTOOLS_METRICS_NAMESPACE": "jobplane"})

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from functions.aws import common, launcher, rerun, sweeper, uptime_cap  # noqa: E402
from jobplane.clouds.s3 import S3Store  # noqa: E402
from jobplane.model import keys  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

HANDLERS = {"launcher": launcher.handler, "sweeper": sweeper.handler, "rerun": rerun.handler,
            "uptime_cap": uptime_cap.handler}
SCHEDULED = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


class Context:
    function_name = "jobplane-bench"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:jobplane-bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:  # the launcher budgets its launches by it
        return 300_000


def invoke(handler: Any) -> tuple[float, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        started = time.perf_counter()
        handler(SCHEDULED, Context())
        elapsed = time.perf_counter() - started
    return elapsed, out.getvalue()


def metric_names(printed: str) -> list[str]:
    names = set()
    for line in printed.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            doc = json.loads(line)
            names |= {m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    return sorted(names)


def scenario(jobs: int, runs: int) -> dict[str, Any]:
    with mock_aws():
        s3 = boto3.client("s3", region_name=check_bench.REGION)
        ec2 = boto3.client("ec2", region_name=check_bench.REGION)
        s3.create_bucket(Bucket=check_bench.BUCKET)
        caps = json.loads((ROOT / "cdk.json").read_text())["context"]["jobplane:policy"]
        s3.put_object(Bucket=check_bench.BUCKET, Key=keys.POLICY, Body=json.dumps(caps).encode())
        if jobs:
            image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
            check_bench.seed(Registry(S3Store(check_bench.BUCKET, s3)), ec2, image, jobs)
        common._clients.clear()
        results: dict[str, Any] = {}
        for name, handler in HANDLERS.items():
            invoke(handler)  # warm: clients created, caches filled (a warm Lambda container)
            counter = check_bench.CallCounter()
            clients = list(common._clients.values())  # every client the handlers made, one per service
            counter.attach(*clients)
            timings, printed = [], 0
            names: set[str] = set()
            for _ in range(runs):
                elapsed, out = invoke(handler)
                timings.append(elapsed)
                printed += len(out.encode())
                names |= set(metric_names(out))
            counter.detach(*clients)
            timings.sort()
            results[name] = {
                "median_ms": round(statistics.median(timings) * 1000, 1),
                "p90_ms": round(timings[int(0.9 * runs) - 1] * 1000, 1),
                "api_calls_per_invocation": {op: n / runs for op, n in sorted(counter.calls.items())},
                "log_bytes_per_invocation": round(printed / runs),
                "metrics_emitted": sorted(names),
            }
        return results


def cold_import_seconds(name: str) -> float:
    code = (f"import sys, time; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'shared')!r}]; t = time.perf_counter(); "
            f"import functions.aws.{name}; print(time.perf_counter() - t)")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return round(float(proc.stdout.strip()), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed invocations of each function per scenario")
    parser.add_argument("--cold-imports", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each handler's import in a fresh interpreter")
    args = parser.parse_args(argv)
    runs = args.runs
    result = {
        "python": sys.version.split()[0],
        "runs_per_handler": runs,
        "scenarios": {"idle": scenario(0, runs), "small_registry_3_jobs": scenario(3, runs)},
        "cold_import_s": {name: cold_import_seconds(name) for name in HANDLERS} if args.cold_imports else {},
    }
    return report.save("lambda_idle", result)


if __name__ == "__main__":
    raise SystemExit(main())
