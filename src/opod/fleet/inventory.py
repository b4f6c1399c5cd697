"""What a node has, as the leader knows it: its GPUs (MIG instances as their own devices), labels and software.

Filled from the worker's registration and heartbeats (NVML where GPUs exist, or
a declared inventory); read by the node views and by placement. A MIG instance
is a device of its own whose ``gpu_class`` names the profile (``A100-80GB/3g.40gb``),
so placement treats each MIG class as a class of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class GPUDevice:
    index: int
    """The device's index on its node; a MIG instance has its own index after the whole cards."""
    label: str
    """How people are shown it: ``0``, or ``0/mig2`` for the third MIG instance of card 0."""
    name: str
    """The card's model name as the driver reports it (``NVIDIA H100 80GB HBM3``)."""
    gpu_class: str
    """What placement and quotas count by: the card's class, or card class and MIG profile."""
    memory_mb: int
    compute_capability: str = ""
    """CUDA compute capability, ``9.0``; empty when unknown."""
    uuid: str = ""
    card: int = 0
    """The physical card it is, or is part of."""
    mig_profile: str = ""
    """``3g.40gb`` for a MIG instance; empty for a whole card."""
    healthy: bool = True
    why: str = ""
    """Why it is unhealthy (an XID, a driver error); empty when healthy."""

    @property
    def mig(self) -> bool:
        return bool(self.mig_profile)


@dataclass(slots=True)
class NodeInventory:
    gpus: list[GPUDevice] = field(default_factory=list)
    """Placeable devices: whole cards without MIG, and MIG instances (a card split into instances is not itself placeable)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels the worker declared (its inventory file or flags)."""
    operator_labels: dict[str, str] = field(default_factory=dict)
    """Labels set through the management API; they win over declared ones of the same key."""
    engine_versions: dict[str, str] = field(default_factory=dict)
    agent_version: str = ""
    features: list[str] = field(default_factory=list)
    models_on_disk: list[str] | None = None
    """``None``: the worker was not asked to look (not the same as holding none)."""
    warnings: list[str] = field(default_factory=list)
    declared: bool = False
    """The GPUs come from a declared inventory, not from the driver (simulated fleets)."""

    def all_labels(self) -> dict[str, str]:
        return self.labels | self.operator_labels
