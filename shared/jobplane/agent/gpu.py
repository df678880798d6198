"""The machine's GPUs: how many, and each one's utilization, memory, power and temperature.

Read through NVML (the `nvidia-ml-py` package, imported lazily: it is not in the agent bundle, a job's image or
requirements may bring it) where the machine has a driver, else by `nvidia-smi`; nothing where there is neither
(a machine without GPUs). One reader serves the heartbeat's utilization (the idle-GPU meter) and the system
metrics (agent/system.py), so each interval costs one reading.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from types import ModuleType
from typing import Any

MAX_GPUS = 16  # per node (spec.Accelerators.count's bound): what a system sample carries at most
GIB = float(1 << 30)
SMI_FIELDS = "index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"


@dataclass(frozen=True)
class GpuReading:
    index: int
    utilization: float | None  # percent
    memory_used: float | None  # GiB
    memory_total: float | None  # GiB
    power: float | None  # W
    temperature: float | None  # degrees C


def _smi(*args: str) -> list[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def parse_smi(lines: list[str]) -> list[GpuReading]:
    """nvidia-smi's CSV (SMI_FIELDS, no header, no units) as readings; "[N/A]" or "[Not Supported]" is None."""
    def value(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    readings = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        util, used, total, power, temp = (value(c) for c in cells[1:])
        readings.append(GpuReading(int(cells[0]), util, None if used is None else used / 1024,
                                   None if total is None else total / 1024, power, temp))
    return readings[:MAX_GPUS]


class Gpus:
    """The GPU reader: NVML when `pynvml` imports and initializes, else nvidia-smi, else no GPUs. `nvml` is the
    module to use (tests pass a fake); None imports pynvml on first use."""

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml
        self._tried = nvml is not None
        self._ready = False

    def _nvml_ready(self) -> Any | None:
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # the nvidia-ml-py package, where the image has it

                self._nvml = pynvml
            except ImportError:
                return None
        if self._nvml is not None and not self._ready:
            try:
                self._nvml.nvmlInit()
                self._ready = True
            except Exception:  # NVMLError: no driver on this machine
                self._nvml = None
        return self._nvml if self._ready else None

    def read(self) -> list[GpuReading]:
        nvml = self._nvml_ready()
        if nvml is not None:
            try:
                return _read_nvml(nvml)
            except Exception:  # a driver that went away (NVMLError): fall back to nvidia-smi from now on
                self._nvml, self._ready = None, False
        return parse_smi(_smi(f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits") or [])

    def utilization(self) -> float | None:
        """Mean utilization over all GPUs, in percent (None: no GPU, or none says)."""
        values = [r.utilization for r in self.read() if r.utilization is not None]
        return sum(values) / len(values) if values else None


def _read_nvml(nvml: Any) -> list[GpuReading]:
    readings = []
    for index in range(min(MAX_GPUS, nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        readings.append(GpuReading(
            index, float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), memory.used / GIB, memory.total / GIB,
            _optional(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000),  # mW
            _optional(lambda h=handle: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)))))
    return readings


def _optional(read: Any) -> float | None:
    """A figure some boards do not report (NVML_ERROR_NOT_SUPPORTED): None rather than no reading at all."""
    try:
        return float(read())
    except Exception:
        return None


def gpu_count() -> int:
    return len(_smi("-L") or [])


MACHINE = Gpus()  # the agent's one reader


def gpu_utilization() -> float | None:
    """Mean utilisation over all GPUs, in percent."""
    return MACHINE.utilization()
