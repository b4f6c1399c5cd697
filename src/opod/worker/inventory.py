"""What a worker can tell about its machine: CPU, memory, disk, GPUs."""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from opod.contract import nodeapi

_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm", "i686": "386"}


@dataclass(frozen=True, slots=True)
class Inventory:
    hostname: str
    os: str
    arch: str
    cpu_cores: int
    ram_gb: int
    disk_free_gb: int
    disk_total_gb: int
    gpus: tuple[nodeapi.GPU, ...]

    def capabilities(self, engine: str, role: str = "", plan_revision: int = 0) -> nodeapi.Capabilities:
        return nodeapi.Capabilities(
            hostname=self.hostname,
            os=self.os,
            arch=self.arch,
            cpu_cores=self.cpu_cores,
            ram_gb=self.ram_gb,
            gpus=list(self.gpus) or None,
            role=role,
            plan_revision=plan_revision,
            engine=engine,
            disk_free_gb=self.disk_free_gb,
            disk_total_gb=self.disk_total_gb,
        )


def _ram_gb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20))
    except OSError:
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    except (ValueError, OSError, AttributeError):
        return 0


def nvidia_gpus() -> tuple[nodeapi.GPU, ...]:
    """NVIDIA cards through NVML; none when the library or the driver is absent."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error types
        return ()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(nodeapi.GPU(name=name.decode() if isinstance(name, bytes) else name, vram_gb=int(memory // (1 << 30))))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def disk_free_gb(home: Path) -> int:
    """Free GiB on the filesystem holding ``home`` (where the worker's weights go); 0 when it cannot be read."""
    try:
        return shutil.disk_usage(home).free // (1 << 30)
    except OSError:
        return 0


def take(home: Path) -> Inventory:
    """The machine as the worker sees it; disk is the filesystem of ``home``, where its weights go."""
    home.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(home)
    machine = platform.machine().lower()
    return Inventory(
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        arch=_GO_ARCH.get(machine, machine),
        cpu_cores=os.cpu_count() or 1,
        ram_gb=_ram_gb(),
        disk_free_gb=disk.free // (1 << 30),
        disk_total_gb=disk.total // (1 << 30),
        gpus=nvidia_gpus(),
    )
