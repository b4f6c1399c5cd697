"""What placement answers and counts by: the replicas that hold devices, an assignment for a new one, the
refusal of a node, and the capacity classes a higher one of which may preempt a lower one."""

from __future__ import annotations

from dataclasses import dataclass, field

from opod.catalog.definition import class_in_force
from opod.contract.admin.catalog import CatalogModel

CLASSES = ("critical", "standard", "opportunistic")
"""Capacity classes, highest first: a replica of a higher class may preempt one of a lower class."""

EVERY_NODE = "*"
"""A rejection's node when the profile itself cannot be placed anywhere (it is malformed)."""


@dataclass(slots=True)
class Held:
    """A replica that holds devices now (running, starting or draining)."""

    replica_id: str
    model: str
    profile: int
    klass: str
    """Its model's effective capacity class."""
    gpus: dict[str, list[int]] = field(default_factory=dict)
    """node id → device indices it holds there (empty list on a node where it uses no GPU)."""
    cpu_cores: float = 0.0
    memory_gb: float = 0.0
    """Host memory it reserves, per node."""


@dataclass(slots=True)
class Assignment:
    model: str
    profile: int
    """Index into the definition's profiles."""
    nodes: list[str]
    """One node, or the ranks of a replica across nodes in order (rank 0 first)."""
    gpus: dict[str, list[int]]
    """node id → device indices given to the replica there."""
    preempts: list[str] = field(default_factory=list)
    """Replica ids of lower classes that must stop first to make room."""
    memory_gb: float = 0.0
    """Host memory the replica reserves on each of its nodes (the profile's ``min_memory_gb``)."""
    cpu_cores: float = 0.0
    """Cores the replica reserves on each of its nodes (the profile's ``cpu_cores``)."""
    gpu_class: str = ""
    """The class of the devices given; empty for a replica on CPUs."""

    def held(self, replica_id: str, klass: str) -> Held:
        """The :class:`Held` record of the replica started from this assignment."""
        return Held(
            replica_id=replica_id,
            model=self.model,
            profile=self.profile,
            klass=klass,
            gpus={node: list(devices) for node, devices in self.gpus.items()},
            cpu_cores=self.cpu_cores,
            memory_gb=self.memory_gb,
        )


@dataclass(slots=True)
class Rejection:
    profile: str
    """The profile's name, or its index when unnamed."""
    pool: str
    """What the profile asked for (a GPU class, ``cpu``, or a GPU need)."""
    node: str
    reason: str
    """The rule that refused and by how much: ``gpu_class: wants H100, has A10G`` or ``gpus: needs 4 free, has 2``."""


def class_rank(klass: str) -> int:
    """0 for critical, 1 for standard (and an empty or unknown class), 2 for opportunistic."""
    return CLASSES.index(klass) if klass in CLASSES else 1


def effective_class(definition: CatalogModel) -> str:
    """The model's class as placement counts it: its own, else opportunistic when on demand, else standard (the catalog's rule)."""
    return class_in_force(definition)
