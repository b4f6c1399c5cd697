"""The host-load readers a worker sends with each heartbeat, and the engines it says it can run.

On this machine the numbers must be in range; on a fake ``/proc`` and ``/sys`` they must be exactly
what the files say, CPU use included (the busy share between two readings).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from opod.contract import nodeapi
from opod.worker import provision
from opod.worker.hostload import GPUSensors, HostLoadReader, cpu_temperature_source, memory

STAT = "cpu  {user} 0 {system} {idle} 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 0 0 0\nintr 1\n"
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    4096000 kB\nCached:  10 kB\n"


def fake_root(tmp_path: Path) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/stat").write_text(STAT.format(user=100, system=100, idle=800))
    (tmp_path / "proc/loadavg").write_text("1.50 0.75 0.25 2/300 4242\n")
    (tmp_path / "proc/meminfo").write_text(MEMINFO)
    hwmon = tmp_path / "sys/class/hwmon"
    (hwmon / "hwmon0").mkdir(parents=True)
    (hwmon / "hwmon0/name").write_text("nvme\n")
    (hwmon / "hwmon0/temp1_input").write_text("33000\n")
    (hwmon / "hwmon1").mkdir()
    (hwmon / "hwmon1/name").write_text("coretemp\n")
    (hwmon / "hwmon1/temp1_input").write_text("54500\n")
    return tmp_path


def test_a_fake_proc_reads_exactly_what_its_files_say(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    reader = HostLoadReader(root)
    first = reader.read()
    assert first.cpu_percent is None  # nothing to compare with yet
    (root / "proc/stat").write_text(STAT.format(user=175, system=125, idle=900))  # 100 busy of 200 jiffies
    load = reader.read()
    assert load.cpus == 2 and load.cpu_percent == 50.0
    assert (load.load1, load.load5, load.load15) == (1.5, 0.75, 0.25)
    assert load.memory_total_bytes == 16384000 * 1024
    assert load.memory_used_bytes == (16384000 - 4096000) * 1024
    assert load.cpu_temp_c == 54.5  # the CPU's sensor, not the disk's
    assert load.gpus is None  # a fake root has no NVML


def test_without_memavailable_or_a_cpu_sensor_the_reader_falls_back_or_leaves_it_out(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 100 kB\nCached: 300 kB\n")
    assert memory(tmp_path) == (500 * 1024, 1000 * 1024)
    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("acpitz\n")
    (zone / "temp").write_text("40000\n")
    assert cpu_temperature_source(tmp_path) is None
    (zone / "type").write_text("x86_pkg_temp\n")
    assert cpu_temperature_source(tmp_path) == zone / "temp"
    load = HostLoadReader(tmp_path / "missing").read()
    assert load.cpu_percent is None and load.load1 is None and load.memory_total_bytes == 0


def test_this_machine_reads_in_range() -> None:
    reader = HostLoadReader()
    sum(i * i for i in range(200_000))  # some CPU time between the two readings
    load = reader.read()
    assert load.cpus == os.cpu_count()
    assert load.cpu_percent is not None and 0 <= load.cpu_percent <= 100
    assert load.load1 is not None and load.load1 >= 0 and load.load15 is not None and load.load15 >= 0
    assert 0 < load.memory_used_bytes < load.memory_total_bytes
    assert load.cpu_temp_c is None or -20 < load.cpu_temp_c < 130
    for gpu in load.gpus or []:  # only where NVML sees GPUs
        assert gpu.temp_c is None or 0 < gpu.temp_c < 120
    again = nodeapi.Heartbeat.from_wire(nodeapi.Heartbeat(id="n", host_load=load).to_json())
    assert again.host_load == load
    reader.close()


def test_the_engines_a_worker_can_run_say_why_not_and_what_to_install() -> None:
    installs = {e.engine: e for e in asyncio.run(provision.survey(gpus=0, ollama_url="http://127.0.0.1:9"))}
    assert list(installs) == ["llamacpp", "ollama", "sglang", "sim", "vllm"]
    assert installs["sim"].state == "ready" and installs["sim"].version
    assert installs["llamacpp"].state == "ready" and installs["llamacpp"].version
    assert installs["llamacpp"].variant in ("portable", "prebuilt", "override")
    assert installs["ollama"].state == "unsupported" and "http://127.0.0.1:9" in installs["ollama"].detail
    for engine in ("vllm", "sglang"):
        detail = installs[engine].detail
        assert installs[engine].state == "unsupported"
        assert detail.startswith(("not installed", "no GPU")) and ("pip install" in detail or "GPU" in detail)


class FakeNVML:
    """pynvml's interface for two cards: the first reads everything, the second little (an older card)."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 0, 1, 1, 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 0, 1

    class NotSupported(Exception):
        pass

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _full(self, handle: int, value):
        if handle == 1:
            raise self.NotSupported()
        return value

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 64 if h == 0 else 40

    def nvmlDeviceGetPowerUsage(self, h):
        return self._full(h, 412_345)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._full(h, 700_000)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._full(h, type("U", (), {"gpu": 87, "memory": 40})())

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("M", (), {"used": 70 << 30, "total": 141 << 30})()

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._full(h, 1980)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._full(h, 0)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._full(h, 3)

    def nvmlDeviceGetRetiredPages(self, h, cause):
        raise self.NotSupported()  # cards with row remapping do not retire pages

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        raise self.NotSupported()

    def nvmlDeviceGetRemappedRows(self, h):
        return self._full(h, (2, 0, 0, 0))


def test_gpu_sensors_read_what_nvml_answers_and_leave_out_what_a_card_cannot_say() -> None:
    sensors = GPUSensors(FakeNVML())
    full, older = sensors.read()
    assert (full.index, full.temp_c, full.power_w, full.power_limit_w) == (0, 64.0, 412.3, 700.0)
    assert (full.util_percent, full.mem_util_percent, full.memory_used_mb, full.memory_total_mb) == (
        87,
        40,
        70 * 1024,
        141 * 1024,
    )
    assert (full.sm_clock_mhz, full.ecc_uncorrected, full.pcie_replays) == (1980, 0, 3)
    assert (
        full.remapped_rows_correctable,
        full.remapped_rows_uncorrectable,
        full.remap_pending,
        full.remap_failure,
    ) == (2, 0, False, False)
    assert full.retired_pages_sbe is None and full.retire_pending is None
    assert older.index == 1 and older.temp_c == 40 and older.power_w is None and older.util_percent is None
    assert '"power_w"' not in older.to_json() and '"memory_total_mb":144384' in older.to_json()
    load = HostLoadReader(gpus=sensors).read()
    assert load.gpus == [full, older]
