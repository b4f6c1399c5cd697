"""How placement words a refusal: the parts of ``explain-placement``'s reasons that describe a node or the fleet.

Each answers a short phrase an operator reads beside the rule that refused (``gpu_class: wants H100,
node has A10G ×4``); :mod:`opod.fleet.placement` decides, this module only says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from opod.fleet.inventory import MACHINE_NETWORK, GPUDevice


class _HasModel(Protocol):
    @property
    def model(self) -> str: ...


def by_network(nodes: Mapping[str, list[str]]) -> str:
    """``ib-a 1 (n1); no fabric 1 (n3)``: the fitting nodes (network → node ids) on each network."""
    return "; ".join(
        f"{network or 'no fabric'} {len(ids)} ({', '.join(ids[:8])})"
        for network, ids in sorted(nodes.items(), key=lambda item: (item[0] == MACHINE_NETWORK, item[0]))
    )


def held_by(replicas: Iterable[_HasModel]) -> str:
    """`` by qwen-7b, llama-70b``: whose replicas hold something, each model once."""
    models = sorted({h.model for h in replicas})
    if not models:
        return ""
    return " by " + ", ".join(models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else "")


def by_class(devices: Iterable[GPUDevice], *, detail: bool = False) -> str:
    """``A10G ×4, T4 ×1``: a node's devices by class; with ``detail``, ``T4 ×8 (7.5, 16 GB)``."""
    counts: dict[str, list[GPUDevice]] = {}
    for device in devices:
        counts.setdefault(device.gpu_class, []).append(device)
    parts = []
    for gpu_class, group in sorted(counts.items()):
        first = group[0]
        extra = (
            f" ({first.compute_capability or 'compute capability unknown'}, {first.memory_mb / 1024:g} GB)"
            if detail
            else ""
        )
        parts.append(f"{gpu_class} ×{len(group)}{extra}")
    return ", ".join(parts)


def unhealthy(devices: list[GPUDevice]) -> str:
    """``3: XID 79; 5: unhealthy``: the unhealthy devices and why."""
    return "; ".join(f"{d.label or d.index}: {d.why or 'unhealthy'}" for d in devices)
