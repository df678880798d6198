"""The agent's system metrics: the sampler over a /proc the test writes, with GPUs read through a fake NVML or a
fake nvidia-smi, and on a machine with neither; and the background loop's chunks of samples on a manual clock
(one chunk per four intervals at most, a few KB each, the rest shipped at the end); and bench/system_metrics.py at
a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobplane.agent.gpu import MAX_GPUS, GpuReading, Gpus, parse_smi
from jobplane.agent.system import SystemSampler
from jobplane.model import keys, sysmetrics
from tests.agent.conftest import LOOP_DATA, make_loop

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


class FakeNvml:
    """NVML's calls as pynvml makes them, over boards the test describes; a board may not report power (as
    NVML_ERROR_NOT_SUPPORTED), and the driver may be missing (nvmlInit fails)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, boards: list[dict[str, float]], *, driver: bool = True) -> None:
        self.boards, self.driver, self.inits = boards, driver, 0

    def nvmlInit(self) -> None:  # pynvml's names
        self.inits += 1
        if not self.driver:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, float]:
        return self.boards[index]

    def nvmlDeviceGetUtilizationRates(self, board: dict[str, float]) -> SimpleNamespace:
        return SimpleNamespace(gpu=int(board["util"]), memory=0)

    def nvmlDeviceGetMemoryInfo(self, board: dict[str, float]) -> SimpleNamespace:
        return SimpleNamespace(used=int(board["used"]), total=int(board["total"]), free=0)

    def nvmlDeviceGetPowerUsage(self, board: dict[str, float]) -> int:
        if "mw" not in board:
            raise RuntimeError("Not Supported")
        return int(board["mw"])

    def nvmlDeviceGetTemperature(self, board: dict[str, float], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(board["temp"])


def proc_tree(root: Path, *, cpu: tuple[int, ...], rx: int, tx: int, total_kib: int = 16 << 20,
              available_kib: int = 12 << 20) -> Path:
    """A /proc with what the sampler reads: the first line of stat, meminfo, net/dev (lo and one NIC)."""
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text(f"MemTotal: {total_kib} kB\nMemFree: 1 kB\nMemAvailable: {available_kib} kB\n")
    (root / "net" / "dev").write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets ...\n"
        f"    lo: 999999 1 0 0 0 0 0 0 999999 1 0 0 0 0 0 0\n"
        f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n")
    return root


def test_the_sampler_reads_cpu_memory_disk_network_and_each_gpu_through_nvml(tmp_path: Path) -> None:
    nvml = FakeNvml([{"util": 87, "used": 9 * GIB, "total": 24 * GIB, "mw": 212_500, "temp": 71},
                     {"util": 12, "used": 1 * GIB, "total": 24 * GIB, "temp": 40}])  # no power reported
    proc = proc_tree(tmp_path / "proc", cpu=(100, 0, 100, 800, 0, 0, 0, 0), rx=1_000_000, tx=0)
    sampler = SystemSampler(tmp_path, Gpus(nvml).read, proc=proc)
    first = sampler.sample(0.0)
    assert "cpu_percent" not in first and "net_in_mb_s" not in first  # rates need a sample before
    assert first["memory_used_gb"] == 4 and first["memory_total_gb"] == 16
    st = os.statvfs(tmp_path)
    assert first["disk_total_gb"] == pytest.approx(st.f_blocks * st.f_frsize / GIB)
    assert 0 < first["disk_used_gb"] <= first["disk_total_gb"]
    assert first["gpu0.utilization"] == 87 and first["gpu0.memory_used_gb"] == 9 and first["gpu0.power_w"] == 212.5
    assert first["gpu0.temperature_c"] == 71 and first["gpu1.memory_total_gb"] == 24
    assert "gpu1.power_w" not in first and first["gpu1.utilization"] == 12  # the board without power still counts

    # 15 s later: 300 of 1,000 jiffies busy (iowait is idle), 30 MB in, 15 MB out
    proc_tree(proc, cpu=(300, 0, 200, 1400, 100, 0, 0, 0), rx=31_000_000, tx=15_000_000)
    second = sampler.sample(15.0)
    assert second["cpu_percent"] == pytest.approx(30.0)
    assert second["net_in_mb_s"] == pytest.approx(2.0) and second["net_out_mb_s"] == pytest.approx(1.0)
    assert nvml.inits == 1  # NVML is initialized once, not per sample


def test_without_a_driver_nvml_gives_way_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, 55, 10240, 81920, 300.25, 66'\necho '1, 5, 512, 81920, [N/A], 35'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    gpus = Gpus(FakeNvml([], driver=False))
    assert gpus.read() == [GpuReading(0, 55, 10, 80, 300.25, 66), GpuReading(1, 5, 0.5, 80, None, 35)]
    assert gpus.utilization() == 30


def test_a_machine_without_gpus_samples_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the package is not installed: import fails
    monkeypatch.setenv("PATH", str(tmp_path))  # and there is no nvidia-smi
    gpus = Gpus()
    assert gpus.read() == [] and gpus.utilization() is None
    proc = proc_tree(tmp_path / "proc", cpu=(1, 0, 1, 8, 0, 0, 0, 0), rx=0, tx=0)
    sampler = SystemSampler(tmp_path, gpus.read, proc=proc)
    sampler.sample(0.0)
    proc_tree(proc, cpu=(2, 0, 2, 16, 0, 0, 0, 0), rx=0, tx=0)
    values = sampler.sample(15.0)
    assert values["cpu_percent"] == 20
    assert not any(name.startswith("gpu") for name in values)
    assert {"cpu_percent", "memory_used_gb", "disk_used_gb", "net_in_mb_s"} <= set(values)


def test_smi_output_that_is_not_a_reading_is_skipped() -> None:
    assert parse_smi(["No devices were found", "0, 1, 2", "x, 1, 2, 3, 4, 5"]) == []
    many = [f"{i}, 50, 1024, 2048, 100, 50" for i in range(40)]
    assert len(parse_smi(many)) == MAX_GPUS


def sixteen_gpus() -> list[GpuReading]:
    return [GpuReading(i, 99.5, 77.123456, 79.647, 699.99, 88.0) for i in range(16)]


def test_samples_go_up_in_bounded_chunks_at_most_one_per_interval_and_the_rest_at_the_end(tmp_path: Path) -> None:
    loop = make_loop()
    proc = proc_tree(tmp_path / "proc", cpu=(1, 0, 1, 8, 0, 0, 0, 0), rx=0, tx=0)
    loop.background.watch_system(SystemSampler(tmp_path, sixteen_gpus, proc=proc), 15)
    loop.until(14 * 15)  # samples at 0, 15, ..., 210: 15 of them
    prefix = keys.system_prefix(LOOP_DATA, 1, 0)
    chunks = [loop.reg.get_bytes(k) for k, _, _ in loop.reg.listing(prefix)]
    assert len(chunks) == 3  # every 4 samples: 12 shipped, 3 waiting
    assert all(len(c.splitlines()) == sysmetrics.SAMPLES_PER_CHUNK for c in chunks)
    assert max(len(line) for c in chunks for line in c.splitlines()) < 4096  # a node with 16 GPUs: a few KB
    times = [loop.written_at(k) for k, _, _ in loop.reg.listing(prefix)]
    assert times == [45, 105, 165]  # never two chunks within one interval

    loop.background.ship_system()  # the agent's end: what is left goes up
    samples = [s for k, _, _ in loop.reg.listing(prefix) for s in sysmetrics.decode(loop.reg.get_bytes(k), 1, 0)]
    at = sorted({s.time for s in samples})
    assert len(at) == 15 and at[1] - at[0] == timedelta(seconds=15)
    gpu15 = [s.value for s in samples if s.name == "gpu15.memory_used_gb"]
    assert gpu15 == [77.12] * 15  # four significant digits


def test_no_sample_is_taken_until_the_spec_asks(tmp_path: Path) -> None:
    loop = make_loop()
    loop.until(300)
    loop.background.ship_system()
    assert not list(loop.reg.listing(keys.system_prefix(LOOP_DATA)))


def test_a_bucket_that_refuses_the_samples_keeps_a_bounded_backlog(tmp_path: Path) -> None:
    loop = make_loop()
    proc = proc_tree(tmp_path / "proc", cpu=(1, 0, 1, 8, 0, 0, 0, 0), rx=0, tx=0)
    loop.background.watch_system(SystemSampler(tmp_path, list, proc=proc), 15)
    loop.store.failures["/system/"] = -1
    loop.until(3600)  # an hour of refusals: 241 samples, each ship failing
    assert len(loop.background._samples) == 60
    loop.store.failures.clear()
    loop.background.ship_system()
    shipped = [k for k, _, _ in loop.reg.listing(keys.system_prefix(LOOP_DATA))]
    assert len(shipped) == 1 and len(loop.reg.get_bytes(shipped[0]).splitlines()) == 60


def test_the_sampling_bench_runs_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "system_metrics.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "system_metrics.py"), "--samples", "3", "--out",
                           str(out)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "shared")})
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["interval_s"] == 15 and set(report["results"]) == {"proc", "nvml-8", "smi-8"}
    for case in report["results"].values():
        assert case["cpu_ms_per_sample"] > 0 and case["core_percent_at_interval"] == pytest.approx(
            case["cpu_ms_per_sample"] / 1000 / 15 * 100, abs=1e-3)
    assert report["results"]["nvml-8"]["line_bytes"] > report["results"]["proc"]["line_bytes"]
