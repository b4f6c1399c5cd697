"""The calls that start and stop a replica on its workers: the reconciler decides, these say it on the wire."""

from __future__ import annotations

import logging

from opod.contract import nodeapi
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.state import Fleet
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.leader.pinned import unload_request
from opod.leader.replicas import Replica, load_requests

log = logging.getLogger("opod.leader")


async def load_replica(fleet: Fleet, workers: WorkerClient, model: KnownModel, replica: Replica) -> str:
    """Ask each of the replica's nodes to load its part; why it could not start, or ``""`` when every node took it."""
    log.info("starting replica %s of %s on %s", replica.id, model.id, "+".join(replica.nodes))
    # Followers first: rank 0 is the one that waits for its peers.
    peers = [node.address if (node := fleet.get(n)) is not None else "" for n in replica.nodes]
    for node_id, req in reversed(load_requests(model, replica, peers)):
        node = fleet.get(node_id)
        if node is None:
            return f"node {node_id} is gone"
        try:
            status, body = await workers.call_json(node, "POST", nodeapi.PATH_MODEL_LOAD, req.to_wire(), timeout=30)
        except WorkerUnavailable as err:
            return f"{node_id}: {err}"
        if status != 200:
            error = (body if isinstance(body, str) else str(body)).strip()[:300] or f"HTTP {status}"
            return f"{node_id} refused the load: {error}"
    return ""


async def unload_replica(fleet: Fleet, workers: WorkerClient, models: ModelRegistry, replica: Replica) -> None:
    """Ask each of the replica's nodes to unload it; a node that cannot be reached is logged, never raised."""
    req = unload_request(replica.model, models.get(replica.model))
    for node_id in replica.nodes:
        node = fleet.get(node_id)
        if node is None or node.goodbye:
            continue  # a worker that said goodbye stops its engines itself, once its requests in flight end
        try:
            await workers.call_json(node, "POST", nodeapi.PATH_MODEL_UNLOAD, req.to_wire(), timeout=60)
        except WorkerUnavailable as err:
            log.warning("stopping replica %s on %s: %s", replica.id, node_id, err)
    log.info("replica %s of %s stopped", replica.id, replica.model)
