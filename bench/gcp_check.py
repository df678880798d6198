"""GCP check cost: calls and time of one check over N healthy RUNNING jobs on the GCP adapters, plus the
cold-start import cost of the Cloud Functions module.

The registry is GcsStore against the precondition-enforcing GCS fake (so every registry call is a real
HTTP request from google-cloud-storage); the VMs are on the Compute fake, listed by the real
google-cloud-compute client (aggregatedList, 500 per page). Registry calls are counted by a wrapper
around the store, Compute calls by the fake. The naive baseline GETs every live job's record.

    .venv/bin/python bench/gcp_check.py               # N = 100, 1000
    .venv/bin/python bench/gcp_check.py --n 100

Writes bench/results/gcp_check.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobplane.clouds.base import Blob, ObjectInfo
from jobplane.clouds.gcp import GceCompute
from jobplane.clouds.gcs import GcsStore
from jobplane.control import reconcile
from jobplane.decide.model import Limits
from jobplane.deployment.context import Context
from jobplane.deployment.telemetry import CountingMetrics
from jobplane.local.fake_compute import FakeComputeServer
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.model import keys
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import DEFAULT_POLICY
from jobplane.model.spec import JobSpec
from jobplane.model.states import State
from jobplane.store.registry import Registry

BUCKET, PROJECT, REGION, ZONE = "jobplane-bench", "jobplane-bench", "us-central1", "us-central1-a"


class CountingStore:
    """An ObjectStore that counts what the control plane asks of the one it wraps."""

    def __init__(self, inner: GcsStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.job_record_gets = 0

    def get(self, key: str) -> Blob:
        self.calls["get"] += 1
        self.job_record_gets += key.endswith("/job.json")
        return self.inner.get(key)

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self.calls["put"] += 1
        return self.inner.put(key, data, content_type)

    def put_if_absent(self, key: str, data: bytes, content_type: str = "application/json",
                      tags: Mapping[str, str] | None = None) -> str:
        self.calls["put"] += 1
        return self.inner.put_if_absent(key, data, content_type, tags)

    def put_if_match(self, key: str, data: bytes, version: str, content_type: str = "application/json") -> str:
        self.calls["put"] += 1
        return self.inner.put_if_match(key, data, version, content_type)

    def list(self, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
        count = 0
        for info in self.inner.list(prefix, page_size):
            count += 1
            yield info
        self.calls["list_pages"] += max(1, -(-count // page_size))

    def delete(self, key: str) -> None:
        self.calls["delete"] += 1
        self.inner.delete(key)


def seed(reg: Registry, compute: FakeComputeServer, n: int) -> None:
    now = datetime.now(UTC)
    spec = JobSpec(run="python3 train.py", instance_type="n2-standard-4", cloud="gcp")
    beat = json.dumps({"time": now.isoformat()}).encode()
    for i in range(n):
        job_id = f"job-{i:05d}"
        vm = compute.add_instance(ZONE, f"{job_id}-a1-0001", {
            "jobplane-managed": "true", "jobplane-job-id": job_id, "jobplane-attempt": "1"})
        limits = Limits(job_id, 1, 1, DEFAULT_POLICY.stall_timeout(spec), DEFAULT_POLICY.max_runtime(spec)).tail
        record = JobRecord(id=job_id, spec=spec.model_copy(update={"id": job_id}), state=State.RUNNING, attempt=1,
                           created_at=now, updated_at=now, state_since=now, launched_at=now, instances=[vm],
                           limits=limits)  # the RUNNING marker's name carries them, as the check writes it
        reg.store.put(reg.key(keys.job_record(job_id)), record.model_dump_json(exclude_none=True).encode())
        reg.store.put(reg.key(record.marker), b"")
        reg.store.put(reg.key(keys.heartbeat(job_id, 1, 0)), beat)
        reg.store.put(reg.key(keys.output_mark(job_id, 1, 0)), beat)


def measure(n: int) -> dict[str, Any]:
    with FakeGcsServer() as gcs, FakeComputeServer(PROJECT, op_polls=0) as compute_fake:
        gcs.create_bucket(BUCKET)
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.endpoint
        store = CountingStore(GcsStore(BUCKET))
        reg = Registry(store)
        compute = GceCompute(PROJECT, REGION, endpoint=compute_fake.endpoint)
        started = time.monotonic()
        seed(reg, compute_fake, n)
        out: dict[str, Any] = {"n": n, "seed_seconds": round(time.monotonic() - started, 1)}

        def naive() -> int:
            records = [reg.job(job_id) for job_id in reg.active()]
            compute.list_managed()
            return len(records)

        for name, run in (("check", lambda: reconcile.check(Context(reg, compute, reg.policy(), CountingMetrics()),
                                                            now=datetime.now(UTC))),
                          ("naive", naive)):
            store.calls.clear()
            store.job_record_gets = 0
            compute_fake.calls.clear()
            t0 = time.monotonic()
            result = run()
            out[name] = {"seconds": round(time.monotonic() - t0, 2), "gcs": dict(store.calls),
                         "compute": dict(compute_fake.calls), "job_record_gets": store.job_record_gets}
            if name == "check":
                out[name]["actions"] = len(result) if isinstance(result, list) else None
        out["job_record_gets_per_healthy_job"] = out["check"]["job_record_gets"] / n
        return out


def import_seconds() -> dict[str, float]:
    """Cold start in a fresh interpreter: the functions module, then the Compute and GCS clients."""
    code = ("import time; t=time.perf_counter(); import functions.gcp.main; a=time.perf_counter(); "
            "from jobplane.clouds.gcp import GceCompute; GceCompute('p', 'r', endpoint='http://127.0.0.1:9'); "
            "b=time.perf_counter(); from jobplane.clouds.gcs import GcsStore; GcsStore('b'); c=time.perf_counter(); "
            "import json; print(json.dumps({'functions_module': a-t, 'compute_client': b-a, 'storage_client': c-b}))")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    root = Path(__file__).parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=root, timeout=300)
    return {k: round(v, 2) for k, v in json.loads(out.stdout).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gcp_check.json")
    args = parser.parse_args(argv)
    results = []
    for n in args.n:
        results.append(measure(n))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    doc = {"bench": "gcp_check", "measured_at": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "import_seconds": import_seconds(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
