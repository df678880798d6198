"""System metrics as stored: one JSON line per sample under teams/<owner>/<id>/system/<attempt>/<rank>/, apart from the
metrics the job prints, and the kinds they are charted by.

A sample is {"time": ISO, "values": {name: number}}: cpu_percent, memory_used_gb, memory_total_gb, disk_used_gb,
disk_total_gb, net_in_mb_s, net_out_mb_s, and per GPU gpu<i>.utilization, gpu<i>.memory_used_gb,
gpu<i>.memory_total_gb, gpu<i>.power_w, gpu<i>.temperature_c. Bounded: at most MAX_VALUES figures of
MAX_NAME characters each, 4 significant digits, so a line of a node with 16 GPUs stays under 4 KB.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobplane.model.metrics import Sample

MAX_VALUES = 7 + 5 * 16  # the machine's figures and five per GPU, for 16 GPUs
MAX_NAME = 32
SAMPLES_PER_CHUNK = 4  # a chunk goes up every 4 samples (a minute at the default 15 s), and at the end
_GPU = re.compile(r"^gpu(\d+)\.(.+)$")


@dataclass(frozen=True)
class Kind:
    """One chart: the figures it draws (a line per rank and GPU) and its unit."""

    key: str
    title: str
    unit: str
    names: tuple[str, ...]  # the machine's names, or the per-GPU suffixes when gpu is set
    gpu: bool = False

    def matches(self, name: str) -> bool:
        if not self.gpu:
            return name in self.names
        found = gpu_of(name)
        return found is not None and found[1] in self.names


KINDS: tuple[Kind, ...] = (
    Kind("cpu", "CPU", "%", ("cpu_percent",)),
    Kind("memory", "Memory used", "GB", ("memory_used_gb",)),
    Kind("disk", "Disk used", "GB", ("disk_used_gb",)),
    Kind("network", "Network", "MB/s", ("net_in_mb_s", "net_out_mb_s")),
    Kind("gpu", "GPU utilization", "%", ("utilization",), gpu=True),
    Kind("gpu_memory", "GPU memory used", "GB", ("memory_used_gb",), gpu=True),
    Kind("gpu_power", "GPU power", "W", ("power_w",), gpu=True),
    Kind("gpu_temperature", "GPU temperature", "°C", ("temperature_c",), gpu=True),
)


def gpu_of(name: str) -> tuple[int, str] | None:
    """(index, figure) of a per-GPU name: gpu3.utilization -> (3, "utilization")."""
    found = _GPU.match(name)
    return (int(found.group(1)), found.group(2)) if found else None


def encode(at: datetime, values: dict[str, float]) -> bytes:
    """A sample as a line of JSON: finite values only, within the bounds above."""
    kept = {name[:MAX_NAME]: float(f"{value:.4g}") for name, value in list(values.items())[:MAX_VALUES]
            if math.isfinite(value)}
    return (json.dumps({"time": at.isoformat(), "values": kept}, separators=(",", ":")) + "\n").encode()


def decode(data: bytes, attempt: int, rank: int) -> list[Sample]:
    """The figures of one chunk, one Sample each (step None); a line that is not a sample is skipped."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            row: Any = json.loads(line)
            at = datetime.fromisoformat(row["time"])
            out += [Sample(attempt, rank, at, str(name), float(value), None) for name, value in row["values"].items()]
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out
