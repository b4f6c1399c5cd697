"""The fabrics the nodes declare, as the node views and the summary count them (``FabricUse``)."""

from __future__ import annotations

from opod.contract.admin.fleet import FabricUse
from opod.fleet.liveness import can_place
from opod.fleet.state import NodeState


def fabric_uses(nodes: list[NodeState], busy: set[str], now: float) -> list[FabricUse]:
    """Each declared fabric: its nodes, those holding weights and the models between them, and its largest free block.

    The free block counts the nodes on the fabric a replica across nodes could take whole:
    up on it (``multi_node`` ready), taking new replicas, and holding nothing (``busy``: the
    ids of nodes where a replica holds devices). Nodes on no fabric are on none of these.
    """
    on: dict[str, list[NodeState]] = {}
    for node in nodes:
        for fabric in node.inventory.fabrics:
            on.setdefault(fabric, []).append(node)
    out = []
    for fabric in sorted(on):
        members = on[fabric]
        weights = [n for n in members if n.inventory.models_on_disk]
        free = sum(
            1
            for n in members
            if fabric in n.inventory.networks()
            and can_place(n, now)[0]
            and n.id not in busy
            and not n.loaded_models
            and not n.model_engines
        )
        out.append(
            FabricUse(
                fabric=fabric,
                nodes=len(members),
                nodes_with_weights=len(weights),
                models_present=len({m for n in weights for m in n.inventory.models_on_disk or ()}),
                largest_free_block=free,
            )
        )
    return out
