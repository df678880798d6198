"""What the agent's system metrics cost the VM: CPU time per sample, and one core's share at the default interval.

Each case takes --samples samples the way the background loop does (SystemSampler.sample, then the sample encoded
as its JSON line), measuring the process's CPU time (time.process_time) plus its children's (nvidia-smi runs as
one), and the wall time:
  proc       this machine's /proc and statvfs, no GPU (a CPU VM)
  nvml-8     the same plus 8 GPUs read through NVML: a fake pynvml module that answers at once, so this is
             jobplane's Python around the calls (the driver's own time, on a real board, is not in it)
  smi-8      the same plus 8 GPUs read through nvidia-smi: a script printing 8 boards' CSV, so this is the
             fork and exec of a process per sample (the real nvidia-smi's own start, ~tens of ms, is not in it)
One core's share = CPU time per sample / the interval (15 s by default).

    .venv/bin/python bench/system_metrics.py                 # 200 samples of each
    .venv/bin/python bench/system_metrics.py --samples 20

Writes bench/results/system_metrics.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobplane.agent.gpu import GpuReading, Gpus
from jobplane.agent.system import SystemSampler
from jobplane.model import sysmetrics
from jobplane.model.spec import JobSpec

GIB = 1 << 30
BOARDS = 8


class InstantNvml:
    """pynvml's calls for BOARDS boards, answered at once."""

    NVML_TEMPERATURE_GPU = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return BOARDS

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50 + handle, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=9 * GIB, total=24 * GIB, free=15 * GIB)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 212_000

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 65


def cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure(read: Callable[[], list[GpuReading]], samples: int, interval: float) -> dict[str, Any]:
    sampler = SystemSampler(Path(tempfile.gettempdir()), read)
    sampler.sample(time.monotonic())  # the first sample has no rates; the loop's later ones all do
    cpu, wall = cpu_seconds(), time.perf_counter()
    size = 0
    for _ in range(samples):
        size = len(sysmetrics.encode(datetime.now(UTC), sampler.sample(time.monotonic())))
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    per_sample = cpu / samples
    return {"cpu_ms_per_sample": round(per_sample * 1e3, 3), "wall_ms_per_sample": round(wall / samples * 1e3, 3),
            "core_percent_at_interval": round(per_sample / interval * 100, 4), "line_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "system_metrics.json")
    args = parser.parse_args()
    interval = float(JobSpec.model_fields["system_metrics_interval"].default)
    with tempfile.TemporaryDirectory() as tmp:
        smi = Path(tmp) / "nvidia-smi"
        rows = "\n".join(f"echo '{i}, {50 + i}, 9216, 24576, 212.00, 65'" for i in range(BOARDS))
        smi.write_text(f"#!/bin/sh\n{rows}\n")
        smi.chmod(0o755)
        cases: dict[str, Callable[[], list[GpuReading]]] = {"proc": list, "nvml-8": Gpus(InstantNvml()).read}
        results = {name: measure(read, args.samples, interval) for name, read in cases.items()}
        path = os.environ["PATH"]
        os.environ["PATH"] = f"{tmp}{os.pathsep}{path}"
        try:
            smi_reader = Gpus(SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no driver"))))
            assert len(smi_reader.read()) == BOARDS
            results["smi-8"] = measure(smi_reader.read, args.samples, interval)
        finally:
            os.environ["PATH"] = path
    report = {"bench": "system_metrics", "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "samples": args.samples, "interval_s": interval,
              "samples_per_chunk": sysmetrics.SAMPLES_PER_CHUNK, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
