"""What a worker can tell about its machine: CPU, memory, disk, GPUs (from NVML, or a declared inventory).

The contract's ``Capabilities`` carries whole cards only (name, whole GiB); the
opod addition ``InventoryReport`` carries every placeable device (MIG instances
as their own), compute capabilities, health, labels and the worker's software.
A declared inventory (:mod:`opod.worker.declared`) replaces the driver's GPUs and
any machine figure it states, and declares the node's fabrics and NVLink wiring.

From NVML, each whole card's NVLink peers are the cards its active links reach:
a link's remote PCI address names a local card directly, and where a link reaches
an NVSwitch instead, the cards NVML says it can reach over NVLink (its P2P status).
A card's multi-node NVLink domain and ``fabric_state`` come from its GPU fabric
info (``joined`` once registered). A machine without NVML, or without NVLink,
reports none; fabrics are reported only as declared.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opod import __version__
from opod.contract import nodeapi
from opod.worker.declared import Declared

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
    devices: tuple[nodeapi.InventoryGPU, ...] = ()
    """Placeable devices: whole cards, and MIG instances of cards split into them."""
    labels: tuple[tuple[str, str], ...] = ()
    declared: bool = False
    warnings: tuple[str, ...] = ()
    fabrics: dict[str, dict[str, str]] = field(default_factory=dict)
    """fabric name → adapter → its port's state, as declared."""

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
            inventory=self.report(engine),
        )

    def report(
        self, engine: str, models_on_disk: list[str] | None = None, features: list[str] | None = None
    ) -> nodeapi.InventoryReport:
        """The opod addition the node views read (docs/contract.md)."""
        return nodeapi.InventoryReport(
            gpus=[d.model_copy() for d in self.devices] or None,
            labels=dict(self.labels) or None,
            # The simulator is opod's own: its version is opod's. Other engines' versions are not read yet.
            engine_versions={engine: __version__} if engine == "sim" else None,
            agent_version=__version__,
            features=features or None,
            models_on_disk=models_on_disk,
            warnings=list(self.warnings) or None,
            declared=self.declared,
            fabrics={name: dict(ports) for name, ports in self.fabrics.items()} or None,
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


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvidia_devices() -> tuple[tuple[nodeapi.InventoryGPU, ...], tuple[str, ...]]:
    """NVIDIA devices through NVML (MIG instances as their own), and warnings; none without the library or driver."""
    try:
        import pynvml
    except ImportError:
        return (), ()
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error types
        return (), ()
    warnings: list[str] = []
    whole: list[nodeapi.InventoryGPU] = []
    split: list[nodeapi.InventoryGPU] = []
    handles: dict[int, Any] = {}
    """Whole card → its NVML handle, for the NVLink wiring once every card is listed."""
    try:
        count = pynvml.nvmlDeviceGetCount()
        for card in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(card)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability = f"{major}.{minor}"
            except Exception:
                capability = ""
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = ""
            instances = _mig_instances(pynvml, handle, card, name, capability, warnings)
            if instances:
                split.extend(instances)
            else:
                domain, fabric_state = _nvlink_domain(pynvml, handle)
                whole.append(
                    nodeapi.InventoryGPU(
                        index=card,
                        label=str(card),
                        name=name,
                        gpu_class=name,
                        memory_mb=int(memory),
                        compute_capability=capability,
                        uuid=uuid,
                        card=card,
                        nvlink_domain=domain,
                        fabric_state=fabric_state,
                    )
                )
                handles[card] = handle
        try:
            peers = _nvlink_peers(pynvml, handles)
        except Exception:  # an NVML too old to know NVLink: no peers, as on a machine without it
            peers = {}
        for device in whole:
            device.nvlink_peers = sorted(peers.get(device.card, ())) or None
    except Exception as err:
        warnings.append(f"NVML stopped answering while listing GPUs: {err}")
    finally:
        pynvml.nvmlShutdown()
    base = max((g.card for g in whole + split), default=-1) + 1
    for offset, device in enumerate(split):
        device.index = base + offset
    return tuple(whole + split), tuple(warnings)


def _mig_instances(
    pynvml: Any, handle: Any, card: int, name: str, capability: str, warnings: list[str]
) -> list[nodeapi.InventoryGPU]:
    """The MIG instances of a card in MIG mode; none when MIG is off or unsupported."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except Exception:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    out: list[nodeapi.InventoryGPU] = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception:
            continue  # an empty slot
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(mig).total // (1 << 20)
            mig_name = _text(pynvml.nvmlDeviceGetName(mig))  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
            profile = mig_name.rsplit(" ", 1)[-1] if " MIG " in mig_name else f"{round(memory / 1024)}gb"
            uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
        except Exception as err:
            warnings.append(f"GPU {card}: MIG instance {slot} could not be read: {err}")
            continue
        out.append(
            nodeapi.InventoryGPU(
                index=0,
                label=f"{card}/mig{len(out)}",
                name=name,
                gpu_class=f"{name}/{profile}",
                memory_mb=int(memory),
                compute_capability=capability,
                uuid=uuid,
                card=card,
                mig_profile=profile,
            )
        )
    return out


def _pci(info: Any) -> tuple[int, int, int]:
    return (int(info.domain), int(info.bus), int(info.device))


def _nvlink_peers(pynvml: Any, handles: dict[int, Any]) -> dict[int, set[int]]:
    """Whole card → the cards it has NVLink to; none for a card whose NVLink NVML cannot read."""
    by_pci: dict[tuple[int, int, int], int] = {}
    for card, handle in handles.items():
        try:
            by_pci[_pci(pynvml.nvmlDeviceGetPciInfo(handle))] = card
        except Exception:
            continue
    out: dict[int, set[int]] = {}
    for card, handle in handles.items():
        peers: set[int] = set()
        switched = False
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = by_pci.get(_pci(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
            except Exception:
                break  # no NVLink on this card, or no link of this number: the links are numbered from 0
            if remote is None:
                switched = True  # an NVSwitch: which cards it reaches is the P2P status's to say
            elif remote != card:
                peers.add(remote)
        if switched:
            for other, other_handle in handles.items():
                try:
                    linked = pynvml.nvmlDeviceGetP2PStatus(handle, other_handle, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                except Exception:
                    continue
                if other != card and linked == pynvml.NVML_P2P_STATUS_OK:
                    peers.add(other)
        if peers:
            out[card] = peers
    return out


_FABRIC_STATES = {"NVML_GPU_FABRIC_STATE_NOT_STARTED": "not joined", "NVML_GPU_FABRIC_STATE_IN_PROGRESS": "joining"}


def _nvlink_domain(pynvml: Any, handle: Any) -> tuple[str, str]:
    """The multi-node NVLink domain (``CLUSTER-UUID/CLIQUE``) the card is in, and its ``fabric_state``; empty for none."""
    try:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, pynvml.byref(info))
    except Exception:
        return "", ""  # an older driver, or a card on no NVLink fabric
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED or not any(info.clusterUuid):
        return "", ""
    raw = bytes(info.clusterUuid).hex()
    domain = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}/{info.cliqueId}"
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return domain, "joined" if info.status == pynvml.NVML_SUCCESS else "not joined"
    words = {getattr(pynvml, k): v for k, v in _FABRIC_STATES.items()}
    return domain, words.get(info.state, "not joined")


def nvidia_gpus() -> tuple[nodeapi.GPU, ...]:
    """NVIDIA cards through NVML as the contract's ``GPUs`` (whole cards, whole GiB); none without a driver."""
    return _cards(nvidia_devices()[0])


def _cards(devices: tuple[nodeapi.InventoryGPU, ...]) -> tuple[nodeapi.GPU, ...]:
    """Each physical card once; a card split into MIG instances counts their memory together."""
    memory: dict[int, tuple[str, int]] = {}
    for device in devices:
        name, mib = memory.get(device.card, (device.name, 0))
        memory[device.card] = (name, mib + device.memory_mb)
    return tuple(nodeapi.GPU(name=memory[c][0], vram_gb=memory[c][1] // 1024) for c in sorted(memory))


def models_on_disk(home: Path) -> list[str]:
    """What the weights folder holds, by name (files and folders; partial downloads left out)."""
    folder = home / "models"
    try:
        return sorted(
            p.name
            for p in folder.iterdir()
            if not p.name.startswith(".") and not p.name.endswith((".part", ".tmp", ".lock"))
        )
    except OSError:
        return []


def disk_free_gb(home: Path) -> int:
    """Free GiB on the filesystem holding ``home`` (where the worker's weights go); 0 when it cannot be read."""
    try:
        return shutil.disk_usage(home).free // (1 << 30)
    except OSError:
        return 0


def take(home: Path, declared: Declared | None = None) -> Inventory:
    """The machine as the worker sees it; disk is the filesystem of ``home``, where its weights go.

    With a declared inventory its GPUs replace the driver's (NVML is not asked) and each
    machine figure it states replaces the measured one.
    """
    home.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(home)
    machine = platform.machine().lower()
    devices: tuple[nodeapi.InventoryGPU, ...]
    warnings: tuple[str, ...]
    if declared is not None:
        devices, warnings = tuple(declared.gpus), ()
    else:
        devices, warnings = nvidia_devices()
    return Inventory(
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        arch=_GO_ARCH.get(machine, machine),
        cpu_cores=(declared.cpu_cores if declared else 0) or os.cpu_count() or 1,
        ram_gb=(declared.memory_gb if declared else 0) or _ram_gb(),
        disk_free_gb=(declared.disk_free_gb if declared else 0) or disk.free // (1 << 30),
        disk_total_gb=(declared.disk_total_gb if declared else 0) or disk.total // (1 << 30),
        gpus=_cards(devices),
        devices=devices,
        labels=tuple(sorted(declared.labels.items())) if declared else (),
        declared=declared is not None,
        warnings=warnings,
        fabrics=dict(declared.fabrics) if declared else {},
    )
