"""What a node has, as the leader knows it: its GPUs (MIG instances as their own devices), labels and software.

Filled from the worker's registration and heartbeats (NVML where GPUs exist, or
a declared inventory); read by the node views and by placement. A MIG instance
is a device of its own whose ``gpu_class`` names the profile (``A100-80GB/3g.40gb``),
so placement treats each MIG class as a class of its own.

Fabrics and multi-node replicas: :meth:`NodeInventory.multi_node` is ``ready`` when
every adapter of every fabric the node declares has an active port, ``down: ADAPTERS``
naming those that do not, and empty for a node on no fabric; :meth:`NodeInventory.networks`
is the one rule of which nodes may form a replica across nodes together (see there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from opod.contract import nodeapi


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
    nvlink_peers: tuple[int, ...] = ()
    """The indices of the node's cards it has NVLink to."""
    nvlink_domain: str = ""
    """The multi-node NVLink domain it belongs to; empty for none."""
    fabric_state: str = ""
    """Where joining that domain stands (``joined``, ``joining``, ``not joined``); empty for none."""

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
    provision: list[nodeapi.EngineInstall] = field(default_factory=list)
    """Each engine the worker can run, with its version and state, as it last reported."""
    fabrics: dict[str, dict[str, str]] = field(default_factory=dict)
    """fabric name → adapter → its port's state (``active`` when up), as the worker declared them."""
    operator: OperatorSide = field(default_factory=lambda: OperatorSide())
    last_seen: float = 0.0
    """Wall-clock time (``time.time()``) it was last heard from; from the store after a leader restart."""

    def all_labels(self) -> dict[str, str]:
        return self.labels | self.operator_labels

    def multi_node(self) -> str:
        """``ready``, ``down: mlx5_1`` (the declared adapters whose ports are not active), or empty on no fabric."""
        if not self.fabrics:
            return ""
        down = [a for ports in self.fabrics.values() for a, state in ports.items() if state != ACTIVE]
        return f"down: {', '.join(down)}" if down else "ready"

    def networks(self) -> frozenset[str]:
        """The networks this node may form a replica across nodes on; nodes pair only on one they share.

        A node on no fabric is on the machine network (:data:`MACHINE_NETWORK`), shared by every
        such node (llama.cpp RPC over Ethernet); a node on fabrics is on each fabric it declares,
        and on none while any of its adapters is down (its own single-node replicas run either way).
        """
        if not self.fabrics:
            return _MACHINE_ONLY
        return frozenset() if self.multi_node() != "ready" else frozenset(self.fabrics)

    def nvlink_domain(self) -> str:
        """The multi-node NVLink domain every whole card has joined; empty when they have not all joined one."""
        cards = [g for g in self.gpus if not g.mig]
        domains = {g.nvlink_domain for g in cards}
        return domains.pop() if len(domains) == 1 and all(g.fabric_state == JOINED for g in cards) else ""


ACTIVE = "active"
"""An adapter port's state when it is up."""
JOINED = "joined"
"""A card's ``fabric_state`` once it has joined its NVLink domain."""
MACHINE_NETWORK = ""
"""The network of the nodes that declare no fabric: the machines' own (Ethernet)."""
_MACHINE_ONLY = frozenset({MACHINE_NETWORK})

LOCATION_LABELS = ("llmgw.io/site", "llmgw.io/room", "llmgw.io/row", "llmgw.io/rack", "llmgw.io/pdu")
"""Labels that say where a node is, for facility-aware placement (``llmgw.io/pdu`` may list several, comma-separated)."""


NO_BUILD = "none"
"""The engine build an operator chooses for an engine that must not run on a node."""


@dataclass(slots=True)
class OperatorSide:
    """What the management API set on a node; kept in the store, never replaced by what the worker reports."""

    engine_builds: dict[str, str] = field(default_factory=dict)
    """engine → the build chosen for it (``auto``, ``none``, or a build such as ``cu129``)."""
    wanted_version: str = ""
    """The release an operator asked this node to run (``POST /nodes/{id}/upgrade``); empty = none asked."""


def devices_from_report(report: nodeapi.InventoryReport | None, cards: list[nodeapi.GPU] | None) -> list[GPUDevice]:
    """The node's devices: from opod's report when the worker sent one, else from the contract's whole cards."""
    if report is not None and report.gpus is not None:
        return [
            GPUDevice(
                index=g.index,
                label=g.label or str(g.index),
                name=g.name,
                gpu_class=g.gpu_class or g.name,
                memory_mb=g.memory_mb,
                compute_capability=g.compute_capability,
                uuid=g.uuid,
                card=g.card,
                mig_profile=g.mig_profile,
                healthy=g.healthy,
                why=g.why,
                nvlink_peers=tuple(g.nvlink_peers or ()),
                nvlink_domain=g.nvlink_domain,
                fabric_state=g.fabric_state,
            )
            for g in report.gpus
        ]
    return [
        GPUDevice(index=i, label=str(i), name=g.name, gpu_class=g.name, memory_mb=g.vram_gb * 1024, card=i)
        for i, g in enumerate(cards or [])
    ]


def apply_report(
    inventory: NodeInventory, report: nodeapi.InventoryReport | None, cards: list[nodeapi.GPU] | None
) -> None:
    """Take the worker's word for what it has; operator labels stay as the management API set them."""
    inventory.gpus = devices_from_report(report, cards)
    if report is None:
        return
    inventory.labels = dict(report.labels or {})
    inventory.engine_versions = dict(report.engine_versions or {})
    inventory.agent_version = report.agent_version
    inventory.features = list(report.features or [])
    inventory.models_on_disk = list(report.models_on_disk) if report.models_on_disk is not None else None
    inventory.warnings = list(report.warnings or [])
    inventory.declared = report.declared
    inventory.provision = list(report.provision or [])
    inventory.fabrics = {name: dict(ports) for name, ports in (report.fabrics or {}).items()}


def nvlink_set(devices: Mapping[int, GPUDevice], free: list[int], count: int) -> list[int]:
    """``count`` of the ``free`` devices, all NVLink peers of each other when such a set exists, else the first ``count``.

    Tensor parallel on one node talks over NVLink when it can. Greedy from each device in
    turn: enough for the shapes NVLink comes in (all to all through NVSwitch, or groups of
    cards linked among themselves).
    """
    if count < 2 or len(free) <= count:
        return free[:count]
    for start in free:
        group = [start]
        for other in free:
            if other != start and all(devices[other].card in devices[g].nvlink_peers for g in group):
                group.append(other)
                if len(group) == count:
                    return sorted(group)
    return free[:count]


def location(labels: dict[str, str]) -> dict[str, object]:
    """``site``, ``room``, ``row``, ``rack`` and ``pdus`` from the location labels; only those present."""
    out: dict[str, object] = {}
    for key in LOCATION_LABELS:
        value = labels.get(key, "").strip()
        if not value:
            continue
        word = key.rsplit("/", 1)[1]
        if word == "pdu":
            out["pdus"] = [p.strip() for p in value.split(",") if p.strip()]
        else:
            out[word] = value
    return out
