"""GPU count and utilisation from nvidia-smi, when the machine has it (None / 0 otherwise)."""

from __future__ import annotations

import shutil
import subprocess


def _smi(*args: str) -> list[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def gpu_count() -> int:
    return len(_smi("-L") or [])


def gpu_utilization() -> float | None:
    """Mean utilisation over all GPUs, in percent."""
    lines = _smi("--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")
    values = [float(v) for v in lines or [] if v.replace(".", "", 1).isdigit()]
    return sum(values) / len(values) if values else None
