"""The host's load at each heartbeat: CPU use, load averages, memory, CPU temperature, GPU sensors.

Cheap by design, as it runs every heartbeat: a few reads under ``/proc`` and ``/sys``
(no subprocess), and NVML calls on a library initialised once. CPU use is the busy
share of all CPUs between two readings of ``/proc/stat``, so the first heartbeat has
none. The root is a parameter so tests can read a fake ``/proc``. A worker on a
declared inventory measures its real host here: the declared GPUs are not sensed.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from opod.contract import nodeapi

_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "x86_pkg_temp", "soc_thermal", "cpu-thermal")
"""hwmon names and thermal zone types that measure the CPU package."""


def cpu_times(root: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from ``proc/stat``; ``None`` when it cannot be read."""
    try:
        with open(root / "proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice: guests are counted in user and nice already.
    total = sum(values[:8])
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return total - idle, total


def load_averages(root: Path) -> tuple[float, float, float] | None:
    try:
        if root == Path("/"):
            return os.getloadavg()
        parts = (root / "proc/loadavg").read_text().split()
        return float(parts[0]), float(parts[1]), float(parts[2])
    except (OSError, ValueError, IndexError):
        return None


def memory(root: Path) -> tuple[int, int] | None:
    """(used, total) bytes from ``proc/meminfo``: used is total less what is available to new work."""
    fields: dict[str, int] = {}
    try:
        with open(root / "proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    total = fields.get("MemTotal", 0)
    if not total:
        return None
    available = fields.get("MemAvailable")
    if available is None:  # kernels before 3.14
        available = fields.get("MemFree", 0) + fields.get("Buffers", 0) + fields.get("Cached", 0)
    return max(0, total - available), total


def cpu_temperature_source(root: Path) -> Path | None:
    """The file giving the CPU's temperature in millidegrees: a CPU hwmon's first input, else a CPU thermal zone."""
    hwmon = root / "sys/class/hwmon"
    try:
        for folder in sorted(hwmon.iterdir()):
            try:
                name = (folder / "name").read_text().strip()
            except OSError:
                continue
            if name in _CPU_SENSORS:
                inputs = sorted(folder.glob("temp*_input"))
                if inputs:
                    return inputs[0]
    except OSError:
        pass
    zones = root / "sys/class/thermal"
    try:
        for zone in sorted(zones.glob("thermal_zone*")):
            try:
                kind = (zone / "type").read_text().strip()
            except OSError:
                continue
            if kind in _CPU_SENSORS:
                return zone / "temp"
    except OSError:
        pass
    return None


def _millidegrees(path: Path) -> float | None:
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return round(value / 1000, 1) if -50_000 < value < 200_000 else None


class GPUSensors:
    """Per-card sensors through NVML, initialised once; no GPUs (or no driver) reads as none.

    ``index`` is the card's NVML index (a card split into MIG instances is sensed as the one card).
    ``nvml``: a module with pynvml's interface instead of pynvml (tests).
    """

    def __init__(self, nvml: Any = None) -> None:
        self._nvml: Any = None
        self._given = nvml
        self._handles: list[Any] = []
        self._tried = False

    def _open(self) -> None:
        self._tried = True
        try:
            nvml = self._given if self._given is not None else importlib.import_module("pynvml")
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self._nvml = nvml
        except Exception:  # no library, no driver, or no GPUs: NVML raises its own error types
            self._handles = []

    def read(self) -> list[nodeapi.GPUSensor]:
        if not self._tried:
            self._open()
        if self._nvml is None:
            return []
        return [self._one(index, handle) for index, handle in enumerate(self._handles)]

    def _one(self, index: int, handle: Any) -> nodeapi.GPUSensor:
        nv = self._nvml
        out = nodeapi.GPUSensor(index=index)

        def ask(call: Any, *args: Any) -> Any:
            try:
                return call(handle, *args)
            except Exception:  # not supported on this card or driver
                return None

        out.temp_c = _num(ask(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU))
        power = ask(nv.nvmlDeviceGetPowerUsage)
        out.power_w = round(power / 1000, 1) if power is not None else None
        limit = ask(nv.nvmlDeviceGetEnforcedPowerLimit)
        out.power_limit_w = round(limit / 1000, 1) if limit is not None else None
        util = ask(nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            out.util_percent, out.mem_util_percent = float(util.gpu), float(util.memory)
        mem = ask(nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            out.memory_used_mb, out.memory_total_mb = float(mem.used >> 20), float(mem.total >> 20)
        out.sm_clock_mhz = _num(ask(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM))
        ecc = ask(nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        out.ecc_uncorrected = int(ecc) if ecc is not None else None
        replays = ask(nv.nvmlDeviceGetPcieReplayCounter)
        out.pcie_replays = int(replays) if replays is not None else None
        sbe = ask(nv.nvmlDeviceGetRetiredPages, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = ask(nv.nvmlDeviceGetRetiredPages, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        out.retired_pages_sbe = len(sbe) if sbe is not None else None
        out.retired_pages_dbe = len(dbe) if dbe is not None else None
        pending = ask(nv.nvmlDeviceGetRetiredPagesPendingStatus)
        out.retire_pending = bool(pending) if pending is not None else None
        remap = ask(nv.nvmlDeviceGetRemappedRows)
        if remap is not None and len(remap) >= 4:
            out.remapped_rows_correctable, out.remapped_rows_uncorrectable = int(remap[0]), int(remap[1])
            out.remap_pending, out.remap_failure = bool(remap[2]), bool(remap[3])
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _num(value: Any) -> float | None:
    return float(value) if value is not None else None


class HostLoadReader:
    """One per worker: :meth:`read` gives the host's load now, CPU use since the previous call."""

    def __init__(self, root: Path | str = "/", gpus: GPUSensors | None = None) -> None:
        self.root = Path(root)
        self._gpus = gpus if gpus is not None else (GPUSensors() if self.root == Path("/") else None)
        self._previous = cpu_times(self.root)
        self._temperature = cpu_temperature_source(self.root)
        self._cpus = (os.cpu_count() or 0) if self.root == Path("/") else _cpu_count(self.root)

    def read(self) -> nodeapi.HostLoad:
        out = nodeapi.HostLoad(cpus=self._cpus)
        now = cpu_times(self.root)
        if now is not None and self._previous is not None:
            busy, total = now[0] - self._previous[0], now[1] - self._previous[1]
            if total > 0:
                out.cpu_percent = round(100 * max(0, min(busy, total)) / total, 1)
        if now is not None:
            self._previous = now
        averages = load_averages(self.root)
        if averages is not None:
            out.load1, out.load5, out.load15 = (round(a, 2) for a in averages)
        mem = memory(self.root)
        if mem is not None:
            out.memory_used_bytes, out.memory_total_bytes = mem
        if self._temperature is not None:
            out.cpu_temp_c = _millidegrees(self._temperature)
        if self._gpus is not None:
            out.gpus = self._gpus.read() or None
        return out

    def close(self) -> None:
        if self._gpus is not None:
            self._gpus.close()


def _cpu_count(root: Path) -> int:
    try:
        with open(root / "proc/stat") as f:
            return sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit())
    except OSError:
        return 0
