"""The dashboard's jobs page at scale: time to first byte and to the whole page, and the store calls one page view
makes (GETs, and LIST pages of 1,000 entries), over N recorded jobs in the in-memory registry
(jobplane.clouds.memory.MemoryStore, which counts its calls).

Seeds N jobs (a fifth RUNNING, the rest SUCCEEDED three days ago, each with its events and active/ marker, and
--chunks log chunks each: what a job writes must not cost the page listing pages), serves the app with uvicorn on
loopback, and fetches the jobs page over HTTP: the first view (every record read once), then warm views (records
kept from the previous view: listings only), the default page (live jobs, and those that ended in the last day:
none here) and ?all=1 (every job), and the fragment htmx polls every 2 s.

    .venv/bin/python bench/ui.py                          # N = 1000 and 10000, 100 log chunks each
    .venv/bin/python bench/ui.py --n 100 1000 --chunks 0

Writes bench/results/ui.json (kept: docs/benchmarks.md's table is made from it by bench/render.py) and prints it
with that table.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn

sys.path[:0] = [str(Path(__file__).resolve().parent)]  # bench/report.py and render.py, as the others import them

import render  # noqa: E402
from report import save  # noqa: E402

from jobplane.clouds.memory import MemoryCompute, MemoryStore  # noqa: E402
from jobplane.local.cloud import free_port  # noqa: E402
from jobplane.model import keys  # noqa: E402
from jobplane.model.spec import parse_spec  # noqa: E402
from jobplane.model.states import State  # noqa: E402
from jobplane.ops.jobs import Backend  # noqa: E402
from jobplane.sdk import Client  # noqa: E402
from jobplane.settings import Settings  # noqa: E402
from jobplane.store.registry import Registry  # noqa: E402
from jobplane.ui.server import create_app  # noqa: E402

SPEC = ("name: bench\ninstance_type: t3.micro\nspot: true\nrun: python train.py\nowner: team-{team}\n"
        "labels: {{project: p{team}}}\n")
WARM_VIEWS = 5


def seed(n: int, chunks: int) -> tuple[MemoryStore, Registry]:
    store = MemoryStore()
    reg = Registry(store, "bench")
    t0 = datetime.now(UTC) - timedelta(days=3)  # the ended jobs ended before the first page's last day
    for i in range(n):
        job_id = f"bench-{i:05d}"
        now = t0 + timedelta(seconds=i)
        reg.create_job(job_id, parse_spec(SPEC.format(team=i % 7), job_id), now=now)
        reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1, instances=[f"i-{i:08x}"],
                       instance_type="t3.micro", now=now + timedelta(seconds=5))
        reg.transition(job_id, State.RUNNING, expect=[State.LAUNCHING], now=now + timedelta(seconds=30))
        if i % 5:
            reg.transition(job_id, State.SUCCEEDED, expect=[State.RUNNING], reason="every rank exited 0",
                           now=now + timedelta(minutes=10))
        for seq in range(chunks):
            store.put(reg.key(keys.log_chunk(keys.JobData(job_id, f"team-{i % 7}"), 1, 0, seq)), b"step 1 loss 0.5\n",
                      "text/plain")
    return store, reg


def fetch(port: int, path: str) -> tuple[float, float, int]:
    """(seconds to the first byte of the response, seconds to its last byte, its size)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    first = response.read(1)
    ttfb = time.perf_counter() - started
    body = first + response.read()
    total = time.perf_counter() - started
    conn.close()
    assert response.status == 200, (path, response.status)
    return ttfb, total, len(body)


def view(store: MemoryStore, port: int, path: str) -> dict[str, Any]:
    before = dict(store.calls)
    ttfb, total, size = fetch(port, path)
    calls = {op: count - before.get(op, 0) for op, count in store.calls.items() if count != before.get(op, 0)}
    return {"ttfb_ms": round(ttfb * 1000, 1), "full_ms": round(total * 1000, 1), "bytes": size, "calls": calls}


def warm(store: MemoryStore, port: int, path: str) -> dict[str, Any]:
    views = [view(store, port, path) for _ in range(WARM_VIEWS)]
    return {"ttfb_ms": round(statistics.median(v["ttfb_ms"] for v in views), 1),
            "full_ms": round(statistics.median(v["full_ms"] for v in views), 1), "bytes": views[-1]["bytes"],
            "calls": views[-1]["calls"]}


def measure(n: int, chunks: int) -> dict[str, Any]:
    store, reg = seed(n, chunks)
    gc.freeze()  # the seeded objects stand for the bucket, which is not in a dashboard's heap for its GC to walk
    port = free_port()
    client = Client.from_settings(Settings(bucket="memory", root=reg.root),
                                  connected=Backend(reg, "s3://memory", MemoryCompute, lambda key, path: None))
    server = uvicorn.Server(uvicorn.Config(create_app(client), host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        return {"jobs": n, "log_chunks_per_job": chunks, "cold_all": view(store, port, "/?all=1"),
                "warm_all": warm(store, port, "/?all=1"),
                "warm_live": warm(store, port, "/"), "warm_poll": warm(store, port, "/fragments/jobs")}
    finally:
        server.should_exit = True
        thread.join(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--chunks", type=int, default=100, help="log chunks each job wrote")
    args = parser.parse_args(argv)
    results = [measure(n, args.chunks) for n in args.n]
    doc = {"bench": "ui", "measured_at": datetime.now(UTC).isoformat(), "load_average": os.getloadavg(),
           "cpus": os.cpu_count(), "warm_views": WARM_VIEWS, "results": results}
    save("ui", doc)
    print(render.ui(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
