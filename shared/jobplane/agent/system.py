"""System metrics: what the machine did while the job ran, sampled every `system_metrics_interval`.

CPU busy %, memory used and total, the job's volume's disk used and total, network in and out (MB/s, every
interface but loopback), and per GPU utilization, memory used and total, power and temperature (agent/gpu.py).
Read from /proc (stat, meminfo, net/dev) and statvfs, no psutil (not in the agent bundle). CPU and network are
rates: the first sample has none, each later one covers the time since the one before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobplane.agent.gpu import GIB, GpuReading

Readings = Callable[[], list[GpuReading]]


@dataclass(frozen=True)
class _Counters:
    at: float  # monotonic seconds
    cpu_busy: int  # jiffies
    cpu_total: int
    net_in: int  # bytes
    net_out: int


class SystemSampler:
    def __init__(self, volume: Path, gpus: Readings, *, proc: Path = Path("/proc")) -> None:
        self.volume, self.gpus, self.proc = volume, gpus, proc
        self._last: _Counters | None = None

    def sample(self, at: float) -> dict[str, float]:
        """One sample's figures by name (model/sysmetrics.py names them); `at` is the agent's monotonic clock."""
        values: dict[str, float] = {}
        now = self._counters(at)
        last, self._last = self._last, now
        if last is not None and now.at > last.at:
            if now.cpu_total > last.cpu_total:
                values["cpu_percent"] = 100 * (now.cpu_busy - last.cpu_busy) / (now.cpu_total - last.cpu_total)
            seconds = now.at - last.at
            values["net_in_mb_s"] = max(0, now.net_in - last.net_in) / seconds / 1e6
            values["net_out_mb_s"] = max(0, now.net_out - last.net_out) / seconds / 1e6
        values.update(self._memory())
        values.update(self._disk())
        for gpu in self.gpus():
            for name, value in (("utilization", gpu.utilization), ("memory_used_gb", gpu.memory_used),
                                ("memory_total_gb", gpu.memory_total), ("power_w", gpu.power),
                                ("temperature_c", gpu.temperature)):
                if value is not None:
                    values[f"gpu{gpu.index}.{name}"] = value
        return values

    def _counters(self, at: float) -> _Counters:
        busy = total = 0
        first = _read(self.proc / "stat").partition("\n")[0].split()
        if first and first[0] == "cpu":
            jiffies = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
            total = sum(jiffies)
            busy = total - jiffies[3] - (jiffies[4] if len(jiffies) > 4 else 0)
        net_in = net_out = 0
        for line in _read(self.proc / "net" / "dev").splitlines()[2:]:
            name, _, counters = line.partition(":")
            fields = counters.split()
            if name.strip() != "lo" and len(fields) >= 9:
                net_in, net_out = net_in + int(fields[0]), net_out + int(fields[8])
        return _Counters(at, busy, total, net_in, net_out)

    def _memory(self) -> dict[str, float]:
        kib: dict[str, int] = {}
        for line in _read(self.proc / "meminfo").splitlines():
            name, _, rest = line.partition(":")
            if rest.split() and rest.split()[0].isdigit():
                kib[name] = int(rest.split()[0])
        if "MemTotal" not in kib or "MemAvailable" not in kib:
            return {}
        return {"memory_used_gb": (kib["MemTotal"] - kib["MemAvailable"]) * 1024 / GIB,
                "memory_total_gb": kib["MemTotal"] * 1024 / GIB}

    def _disk(self) -> dict[str, float]:
        volume = self.volume
        while not volume.exists() and volume != volume.parent:  # before the agent has made it: the disk it will be on
            volume = volume.parent
        try:
            st = os.statvfs(volume)
        except OSError:
            return {}
        return {"disk_used_gb": (st.f_blocks - st.f_bfree) * st.f_frsize / GIB,
                "disk_total_gb": st.f_blocks * st.f_frsize / GIB}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
