"""What one profile of a model asks of a node: an engine, devices of a class or a need, per node and across nodes, host resources.

:func:`ask_of` reads a ``catalog.Profile`` once into an :class:`Ask`, with a
``problem`` when the profile contradicts itself (tp × pp against gpus_per_node ×
nodes); placement (``fleet.placement``) checks each node against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.fleet.inventory import GPUDevice


def profile_label(profile: CatalogProfile, index: int) -> str:
    return profile.name or str(index)


@dataclass(slots=True)
class Ask:
    index: int
    label: str
    pool: str
    engine: str
    engine_version: str
    gpus: bool
    """It wants GPUs (a class, a need, or a device count)."""
    gpu_class: str
    min_cc: float
    min_vram_gb: float
    per_node: int
    nodes: int
    memory_gb: float
    cpu_cores: float
    disk_gb: float
    selector: dict[str, str]
    keep_within: str
    sources: frozenset[str]
    problem: str = ""

    def device_fits(self, device: GPUDevice) -> bool:
        if self.gpu_class:
            return device.gpu_class == self.gpu_class
        if self.min_vram_gb and device.memory_mb < self.min_vram_gb * 1024:
            return False
        if self.min_cc:
            try:
                return float(device.compute_capability) >= self.min_cc - 1e-9
            except ValueError:
                return False
        return True

    def wanted(self) -> str:
        """What a node's devices are asked to be, in words: ``H100``, ``compute capability ≥ 8.0, ≥ 40 GB``."""
        if self.gpu_class:
            return self.gpu_class
        parts = ([f"compute capability ≥ {self.min_cc:g}"] if self.min_cc else []) + (
            [f"≥ {self.min_vram_gb:g} GB"] if self.min_vram_gb else []
        )
        return " and ".join(parts) or "any GPU"


def ask_of(name: str, definition: CatalogModel, profile: CatalogProfile, index: int, engine: str) -> Ask:
    need = profile.gpu
    min_cc = float(need.min_compute_capability or 0) if need else 0.0
    min_vram = float(need.min_memory_gb or 0) if need else 0.0
    tp, pp = profile.tp or 1, profile.pp or 1
    total = tp * pp
    wants_gpus = bool(profile.gpu_class or min_cc or min_vram or profile.gpus_per_node or total > 1)
    nodes = profile.nodes or 1
    problem = ""
    if min(tp, pp, nodes) < 1 or (profile.gpus_per_node or 0) < 0:
        problem = f"profile: tp {tp}, pp {pp} and nodes {nodes} must each be at least 1"
        per_node = 0
    elif profile.gpus_per_node:
        per_node = profile.gpus_per_node
        if profile.nodes is None and total > per_node:
            nodes = math.ceil(total / per_node)
        if per_node * nodes != total:
            problem = (
                f"profile: tp×pp = {total} GPUs a replica, but gpus_per_node {per_node} × nodes {nodes} = "
                f"{per_node * nodes}; make them agree"
            )
    else:
        per_node = math.ceil(total / nodes) if wants_gpus else 0
        if wants_gpus and per_node * nodes != total:
            problem = f"profile: tp×pp = {total} GPUs do not split evenly over {nodes} nodes; set gpus_per_node"
    if profile.gpu_class:
        pool = profile.gpu_class
    elif wants_gpus:
        pool = "gpu" + "".join([f" cc≥{min_cc:g}" if min_cc else "", f" ≥{min_vram:g}GB" if min_vram else ""])
    else:
        pool = "cpu"
    sources = frozenset(s for s in (name, definition.source, profile.source) if s)
    return Ask(
        index=index,
        label=profile_label(profile, index),
        pool=pool,
        engine=profile.engine or engine,
        engine_version=profile.engine_version or "",
        gpus=wants_gpus,
        gpu_class=profile.gpu_class or "",
        min_cc=min_cc,
        min_vram_gb=min_vram,
        per_node=per_node,
        nodes=nodes,
        memory_gb=float(profile.min_memory_gb or 0),
        cpu_cores=float(profile.cpu_cores or 0),
        disk_gb=float(profile.min_disk_gb or 0),
        selector=dict(profile.node_selector or {}),
        keep_within=profile.keep_within or "",
        sources=sources,
        problem=problem,
    )


def version_matches(version: str, prefix: str) -> bool:
    """``0.11`` takes ``0.11.0`` and ``0.11.1``, not ``0.10.2`` nor ``0.110``; a leading ``v`` is ignored."""
    version, prefix = version.removeprefix("v"), prefix.removeprefix("v")
    return version == prefix or version.startswith(prefix if prefix.endswith((".", "-", "+")) else prefix + ".")
