"""docs/benchmarks.md's tables, made from the JSON the benchmarks wrote (bench/results/*.json, the files kept).

The page marks each generated block `<!-- bench:NAME -->` ... `<!-- /bench:NAME -->`; NAME is the results file
(without .json) and what is between the marks is replaced by its table. tests/test_bench.py checks that the
committed page is what this makes of the committed JSON.

    .venv/bin/python bench/render.py            # rewrite docs/benchmarks.md's blocks
    .venv/bin/python bench/render.py --check    # exit 1 if the page is not what the JSON makes
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(.*?)(<!-- /bench:(?P=name) -->)", re.S)
TOOLS = {"jobplane": "jobplane", "baseline": "jobplane before (main)", "s5cmd": "s5cmd", "aws-cli": "aws-cli",
         "boto3-default": "boto3 default", "gcs-default": "client defaults"}


def transfer(doc: dict[str, Any]) -> str:
    """One row per data set and tool: throughput, CPU (per GiB or per file), peak RSS; then jobplane's ratios."""
    data = doc["data"]
    sets = {"big": f"{data['big_mib'] / 1024:g} GiB" if data["big_mib"] >= 1024 else f"{data['big_mib']} MiB",
            "many": f"{data['files']:,} x {data['file_kib']} KiB"}
    keyed = {(r["data"], r["tool"], r["direction"]): r for r in doc["rows"]}
    lines = ["| data | tool | upload | download | CPU up / down | peak RSS up / down |",
             "|---|---|---:|---:|---:|---:|"]
    for key in ("big", "many"):
        for tool in [t for t in TOOLS if (key, t, "up") in keyed]:
            up, down = keyed[(key, tool, "up")], keyed[(key, tool, "down")]
            if key == "big":
                rate, cpu = (lambda r: f"{r['mb_per_s']:,.0f} MB/s"), (lambda r: f"{r['cpu_s_per_gib']:.2f}")
                unit = "s/GiB"
            else:
                rate, cpu = (lambda r: f"{r['files_per_s']:,.0f} files/s"), (lambda r: f"{r['cpu_ms_per_file']:.2f}")
                unit = "ms/file"
            lines.append(f"| {sets[key]} | {TOOLS[tool]} | {rate(up)} | {rate(down)} | {cpu(up)} / {cpu(down)} {unit} "
                         f"| {up['peak_rss_mb']:.0f} / {down['peak_rss_mb']:.0f} MB |")
    lines.append("")
    for other, got in doc["jobplane_over"].items():
        if other not in ("s5cmd", "baseline"):
            continue
        cells = [f"{sets[k.split(':')[1]]} {k.split(':')[2]} **{v['throughput']:.2f}x** (CPU {v['cpu']:.2f}x)"
                 for k, v in got.items()]
        lines.append(f"- jobplane against {TOOLS[other]}, throughput (and CPU, as a multiple of its): "
                     + "; ".join(cells) + ".")
    load = doc["machine"]
    lines.append(f"- Samples per tool: {data['samples']} (the slow one-file-at-a-time loops: 1); medians. Load average "
                 f"{load['load_before'][0]:.1f} at the start, {load['load_after'][0]:.1f} at the end, on "
                 f"{load['cpus']} cores; measured {doc['measured_at'][:10]}.")
    return "\n".join(lines) + "\n"


def ui(doc: dict[str, Any]) -> str:
    """bench/ui.py: one row per registry size, each view's full-page time, GETs and LIST pages; then the load."""
    lines = ["| jobs x log chunks each | first view, every job: full page, GETs, LIST pages | next views, every job "
             "| next views, the first page | the htmx poll |", "|---|---|---|---|---|"]
    for r in doc["results"]:
        cells = [f"{r['jobs']:,} x {r['log_chunks_per_job']}"]
        for name in ("cold_all", "warm_all", "warm_live", "warm_poll"):
            v = r[name]
            cells.append(f"{v['full_ms']:.0f} ms, {v['calls'].get('get', 0):,}, {v['calls'].get('list', 0)}")
        lines.append("| " + " | ".join(cells) + " |")
    load = doc["load_average"]
    lines += ["", f"- Next views: the median of {doc['warm_views']}. Load average {load[0]:.1f} (1 min), "
              f"{load[1]:.1f} (5 min) at the end, on {doc['cpus']} cores; measured {doc['measured_at'][:10]}."]
    return "\n".join(lines) + "\n"


def cold_start(doc: dict[str, Any]) -> str:
    """bench/cold_start.py: the baseline, then each handler's import as a multiple of it, its first invocation."""
    before, after = doc["load_average_before"][0], doc["load_average_after"][0]
    lines = [f"In the stored run ({doc['rounds']} rounds, Python {doc['python']}, load average {before:.1f} before "
             f"and {after:.1f} after, on {doc['cpus']} cores), the baseline took {doc['baseline']['import_ms']:.1f} ms "
             f"(median). The floor (the baseline and the policy's module: PyYAML and the policy's plain checks, which "
             f"every control function's run reads) took {doc['floor']['import_ms']:.1f} ms, "
             f"{doc['floor']['ratio']:.2f}x the baseline.",
             "Each AWS handler's import, as a multiple of the baseline:", "",
             "| handler | import | x baseline | first scheduled invocation (idle registry) "
             "| import + first invocation | pydantic loaded by then |",
             "|---|---:|---:|---:|---:|---|"]
    for name, h in sorted(doc["handlers"].items()):
        first = h.get("first_invocation_ms")
        loaded = h.get("pydantic_after_first_invocation")
        lines.append(f"| {name} | {h['import_ms']:.1f} ms | {h['ratio']:.2f} | "
                     + (f"{first:.1f} ms | {h['import_plus_first_invocation_ms']:.1f} ms | " if first is not None
                        else "- | - | ")
                     + ("-" if loaded is None else "yes" if loaded else "no") + " |")
    return "\n".join(lines) + "\n"


def check(doc: dict[str, Any]) -> str:
    """bench/check.py: one row per number of healthy jobs, the check's calls (LIST pages by prefix) against the naive
    loop's; then the times and the load."""
    lines = ["| healthy jobs | check calls (LIST / DescribeInstances / GET) | LIST pages by prefix "
             "| job.json GETs per job | naive calls (GETs) | calls naive / check |", "|---:|---|---|---:|---|---:|"]
    for r in doc["results"]:
        s, naive = r["check"], r["naive"]
        pages = ", ".join(f"`{prefix}` {n}" for prefix, n in s["list_pages"].items())
        lines.append(f"| {r['n']:,} | {s['total_calls']} ({s['calls'].get('s3.ListObjectsV2', 0)} / "
                     f"{s['calls'].get('ec2.DescribeInstances', 0)} / {s['get_object']}) | {pages} | "
                     f"{r['job_record_gets_per_healthy_job']:g} | {naive['total_calls']:,} ({naive['get_object']:,}) | "
                     f"{r['call_ratio_naive_over_check']:g}x |")
    times = "; ".join(f"{r['n']:,}: {r['check']['s3_seconds']} s against {r['naive']['s3_seconds']} s"
                      for r in doc["results"])
    before, after = doc["load_average_before"][0], doc["load_average_after"][0]
    lines += ["", f"- The S3 part of the check against the naive loop's: {times}. Load average {before:.1f} at the "
              f"start, {after:.1f} at the end, on {doc['cpus']} cores; measured {doc['measured_at'][:10]}."]
    return "\n".join(lines) + "\n"


def queue_scale(doc: dict[str, Any]) -> str:
    """bench/queue_scale.py: Kueue's published baseline, then the replay as given and its variants, each with what
    its functions' runs spent of the wall time."""
    kueue = doc["kueue"]
    lines = ["| run | jobs | wall | nodes held (busy) while work waits | mean time to admission: small / medium / "
             "large | over admitted | store calls a job |", "|---|---:|---:|---:|---:|---:|---:|",
             f"| Kueue's baseline (published: the mean of 5 runs) | 15,000 | {kueue['wall_s']:.0f} s | "
             f"{kueue['usage_percent']}% | " + " / ".join(f"{kueue['mean_admission_s'][k]:g} s" for k in
                                                          ("small", "medium", "large")) + " | - | - |"]
    runs = [("jobplane, the baseline as given", doc), *((f"jobplane, {name}", v) for name, v in
                                                        doc.get("variants", {}).items())]
    for name, r in runs:
        means = " / ".join("-" if r["mean_admission_s"][k] is None else f"{r['mean_admission_s'][k]:,.1f} s"
                           for k in ("small", "medium", "large"))
        scaled = r.get("mean_admission_kueue_time_s")
        if scaled and r["config"]["time_scale"] != 1:
            means += " (" + " / ".join(f"{scaled[k]:.3g} s" for k in ("small", "medium", "large")) + " in Kueue's time)"
        lines.append(f"| {name} | {r['jobs']:,} | {r['wall_s']:,.0f} s | {r['usage_percent']}% "
                     f"({r['busy_percent']}%) | {means} | {r['over_admitted']} | {r['store_calls_per_job']:g} |")
    lines.append("")
    for name, r in runs:
        c = r["config"]
        calls, latency = r["store_calls"], c["latency_ms"] / 1000
        check = sum(n for k, n in calls.items() if k.startswith("sweeper")) * latency
        launch = sum(n for k, n in calls.items() if k.startswith("launcher")) * latency / c["launchers"]
        lines.append(f"- {name}: {c['owners']} owners, runtimes and intervals x"
                     f"{c['time_scale']:g}, {c['latency_ms']:g} ms a store call, {c['launchers']} launcher runs at "
                     f"once, owner quotas {c['quota'] + c['borrow']} under a cap of {c['cap']}. The check's calls "
                     f"took {check:,.0f} s of the {r['wall_s']:,.0f} s (one run at a time), the launcher's "
                     f"{launch:,.0f} s of each of its {c['launchers']} runs; {r['run_s']:,.0f} s to replay.")
    lines.append(f"- Measured {doc['measured_at'][:10]}.")
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"transfer-rclone": transfer, "transfer-gcs": transfer,
                                                         "ui": ui, "cold-start": cold_start, "check": check,
                                                         "queue_scale": queue_scale}


def render(page: str, results: Path = HERE / "results") -> str:
    """The page with every marked block made anew from its JSON."""
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        return match[1] + RENDERERS[name](json.loads((results / f"{name}.json").read_text())) + match[4]
    return BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is up to date")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    made = render(page)
    if args.check:
        if made != page:
            print(f"{PAGE} is not what bench/results/ makes: run bench/render.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
