"""Idle cost inputs on GCP: how long each scheduled Cloud Function runs, and what it calls, against the fakes.

Calls the four HTTP entry points of functions/gcp/main.py (launcher_backstop, sweeper, rerun, uptime_cap)
through functions-framework's test client with the POST Cloud Scheduler sends, against the GCS fake (the
real google-cloud-storage client) and the Compute Engine fake (the real google-cloud-compute client), for an
empty registry ("idle") and a small one (3 healthy RUNNING jobs with VMs, heartbeats and limits). Per
function: median and p90 wall time of 20 warm invocations, registry calls (GCS operations by class: a read is
two class B requests, metadata then media; a listing page or a write is one class A; deletes are free),
Compute calls, bytes written to the log (Cloud Logging ingestion); plus the cold start (bench/gcp_check.py).

The fakes answer in about a millisecond where GCS and Compute Engine take tens: the README's arithmetic adds a
per-call latency to the measured durations and says so.

    .venv/bin/python bench/gcp_idle.py        # writes bench/results/gcp_idle.json
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import gcp_check  # noqa: E402  (bench/gcp_check.py: the counting store and the seeding)
import report  # noqa: E402
from functions_framework import create_app  # noqa: E402

from jobplane.clouds.gcs import GcsStore  # noqa: E402
from jobplane.local.fake_compute import FakeComputeServer  # noqa: E402
from jobplane.local.fake_gcs import FakeGcsServer  # noqa: E402
from jobplane.model import keys  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402

MAIN = ROOT / "functions" / "gcp" / "main.py"
SCHEDULED = ("launcher_backstop", "sweeper", "rerun", "uptime_cap")
CLOUD_SCHEDULER = {"data": "{}", "headers": {"Content-Type": "application/json"}}  # the jobs' http_target body


def scenario(jobs: int, runs: int) -> dict[str, Any]:
    with FakeGcsServer() as gcs, FakeComputeServer(gcp_check.PROJECT, op_polls=0) as compute:
        gcs.create_bucket(gcp_check.BUCKET)
        os.environ.update({"STORAGE_EMULATOR_HOST": gcs.endpoint, "JOBPLANE_COMPUTE_ENDPOINT": compute.endpoint,
                           "JOBPLANE_BUCKET": gcp_check.BUCKET, "JOBPLANE_REGION": gcp_check.REGION,
                           "JOBPLANE_CLOUD": "gcp", "GOOGLE_CLOUD_PROJECT": gcp_check.PROJECT})
        store = gcp_check.CountingStore(GcsStore(gcp_check.BUCKET))
        reg = Registry(store)
        reg.put_json(keys.POLICY, {"gcp": {"project": gcp_check.PROJECT}})
        if jobs:
            gcp_check.seed(reg, compute, jobs)
        results: dict[str, Any] = {}
        for name in SCHEDULED:
            client = create_app(name, str(MAIN), "http").test_client()
            sys.modules["main"]._stores[gcp_check.BUCKET] = store  # the module it loaded: its GCS client, counted
            log = io.StringIO()
            handler = next(h for h in logging.getLogger("jobplane").handlers if h.name == "jobplane-gcp")
            handler.setStream(log)
            assert client.post("/", **CLOUD_SCHEDULER).status_code == 200  # warm: clients made, module loaded
            store.calls.clear()
            compute.calls.clear()
            log.seek(0)
            log.truncate()
            timings = []
            for _ in range(runs):
                started = time.perf_counter()
                response = client.post("/", **CLOUD_SCHEDULER)
                timings.append(time.perf_counter() - started)
                assert response.status_code == 200, response.data
            timings.sort()
            calls = dict(store.calls)
            results[name] = {
                "median_ms": round(statistics.median(timings) * 1000, 1),
                "p90_ms": round(timings[int(0.9 * runs) - 1] * 1000, 1),
                "registry_calls_per_invocation": {op: n / runs for op, n in sorted(calls.items())},
                "gcs_class_a_per_invocation": (calls.get("list_pages", 0) + calls.get("put", 0)) / runs,
                "gcs_class_b_per_invocation": 2 * calls.get("get", 0) / runs,
                "compute_calls_per_invocation": {op: n / runs for op, n in sorted(compute.calls.items())},
                "log_bytes_per_invocation": round(len(log.getvalue().encode()) / runs),
            }
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed invocations of each function per scenario")
    parser.add_argument("--cold-start", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the functions module's and the clients' import in a fresh interpreter "
                             "(bench/gcp_check.py's, about 2.5 CPU s)")
    args = parser.parse_args(argv)
    runs = args.runs
    result = {
        "bench": "gcp_idle",
        "measured_at": datetime.now(UTC).isoformat(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "runs_per_function": runs,
        "scenarios": {"idle": scenario(0, runs), "small_registry_3_jobs": scenario(3, runs)},
        # the module, then the Compute and GCS clients
        "cold_start_s": gcp_check.import_seconds() if args.cold_start else {},
    }
    return report.save("gcp_idle", result)


if __name__ == "__main__":
    raise SystemExit(main())
