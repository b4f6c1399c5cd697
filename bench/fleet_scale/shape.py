"""What the simulated fleet is made of: the nodes' declared inventories and the 500 models placed on them.

Three nodes in four have 8 × H100 80 GB; every fourth has 8 × A100 80 GB, two of them split
into MIG instances (3g.40gb × 2 each), so a node has 10 placeable devices and MIG classes are
in play. Half the models want one H100, half two (tensor parallel); each has a fallback profile
asking any GPU of at least 40 GB, which is what places them once the H100s are full (at 100
nodes the H100s hold 600 GPUs, the models want 750).

The swarm (the simulated workers) and the in-process placement measurement both build their
nodes from here, so the two measure the same fleet.
"""

from __future__ import annotations

import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from opod.contract import nodeapi
from opod.fleet.inventory import apply_report
from opod.fleet.state import NodeState
from opod.worker.declared import Declared, parse
from opod.worker.inventory import take

ENGINE = "sim"
GPUS_PER_NODE = 8
H100_CLASS = "H100-80GB"

_MACHINE = {"cpu_cores": 192, "memory_gb": 2048, "disk_total_gb": 30000, "disk_free_gb": 20000}
_H100 = {"name": "NVIDIA H100 80GB HBM3", "class": H100_CLASS, "memory_gb": 80, "compute_capability": "9.0"}
_A100 = {"name": "NVIDIA A100-SXM4-80GB", "class": "A100-80GB", "memory_gb": 80, "compute_capability": "8.0"}


def node_id(i: int) -> str:
    return f"fs-{i:04d}"


def is_a100(i: int) -> bool:
    return i % 4 == 3


def declared_inventory(i: int) -> dict[str, Any]:
    """Node ``i``'s declared inventory, in the form of an ``opod join --inventory`` file."""
    if is_a100(i):
        gpus = [
            {**_A100, "count": 6},
            {**_A100, "count": 2, "mig": [{"profile": "3g.40gb", "memory_gb": 40, "count": 2}]},
        ]
    else:
        gpus = [{**_H100, "count": GPUS_PER_NODE}]
    labels = {"llmgw.io/site": f"site-{i % 3}", "llmgw.io/rack": f"rack-{i // 16:03d}", "bench": "fleet-scale"}
    return {"gpus": gpus, "labels": labels, **_MACHINE}


def declared(i: int) -> Declared:
    return parse(declared_inventory(i), f"node {i}")


def capabilities(i: int) -> nodeapi.Capabilities:
    """What node ``i`` registers with: the declared inventory, as a worker started with it reports it."""
    # The worker's own reading of a declared inventory; only the host name differs between the nodes.
    inventory = replace(take(Path(tempfile.gettempdir()), declared(i)), hostname=f"{socket.gethostname()}-{node_id(i)}")
    return inventory.capabilities(ENGINE)


def node_states(count: int, address: str = "127.0.0.1:1") -> list[NodeState]:
    """``count`` nodes as the leader holds them after registration and a fresh heartbeat (for the in-process planner)."""
    now = time.monotonic()
    out = []
    for i in range(count):
        caps = capabilities(i)
        node = NodeState(
            id=node_id(i), address=address, hostname=caps.hostname, hardware=caps, last_heartbeat=now, registered_at=now
        )
        apply_report(node.inventory, caps.inventory, caps.gpus)
        out.append(node)
    return out


def model_name(j: int) -> str:
    return f"fs-model-{j:03d}"


def model_definition(j: int, window: tuple[str, str] | None = None) -> dict[str, Any]:
    """Model ``j`` as ``POST /api/v1/models`` takes it (a ``catalog.Model``).

    With ``window`` (``HH:MM`` from and to) it is on demand outside that window and wants one
    replica inside it: every model becomes wanted at the same minute, so one reconciler pass
    places them all.
    """
    tp = 1 if j % 2 == 0 else 2
    body: dict[str, Any] = {
        "name": model_name(j),
        "description": "fleet-scale benchmark model",
        "class": "standard",
        "profiles": [
            {"name": "h100", "engine": ENGINE, "gpu_class": H100_CLASS, "tp": tp, "priority": 10},
            {"name": "any-40gb", "engine": ENGINE, "gpu": {"min_memory_gb": 40}, "tp": tp},
        ],
    }
    if window is not None:
        start, end = window
        body["scaling"] = {"min": 0, "max": 1, "schedule": [{"from": start, "to": end, "min": 1, "max": 1}]}
    else:
        body["scaling"] = {"min": 1, "max": 1}
    return body
