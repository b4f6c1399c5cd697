"""The reconciler's replicas and the fleet's summary as ``/api/v1`` shows them, read from the leader's memory.

Everything here is read from the fleet and the reconciler's replicas, never the store: a summary of
two hundred nodes is an aggregate over the same facts the node and replica tables show; ``fabrics``
is one ``FabricUse`` per fabric the nodes declare (``fleet.fabrics.fabric_uses``). Parts opod has no
such thing of (store members, control planes, judges) are left out rather than invented. The route
module (:mod:`opod.control.replicas`) and the console's pages both answer with these.
"""

from __future__ import annotations

import time

from opod import __version__
from opod.catalog.definition import fingerprint
from opod.contract.admin.fleet import (
    ClassUse,
    IdleReplica,
    ModelTotals,
    NodeTotals,
    ParkedModel,
    ReplicaTotal,
    ReplicaView,
    ShardView,
    Summary,
)
from opod.control.context import ReplicaDesk, ReplicaRecord
from opod.fleet.fabrics import fabric_uses
from opod.fleet.liveness import HEARTBEAT_MAX_AGE
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet

IDLE_AFTER = 300.0
"""Seconds without a request before a ready replica counts among the summary's idle ones."""


def _seconds(since: float, now: float) -> int:
    return max(int(now - since), 0)


def idle_seconds(desk: ReplicaDesk, replica: ReplicaRecord, now: float) -> int:
    """Seconds since a request asked for the replica's model (or since it became ready, if later); -1 = none asked yet."""
    last = desk.last_request(replica.model)
    if last is None:
        return -1
    return _seconds(max(last, replica.ready_at), now)


def replica_view(
    models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk, replica: ReplicaRecord, now: float
) -> ReplicaView:
    model = models.get(replica.model)
    definition = model.definition if model is not None else None
    stale = definition is not None and bool(replica.fingerprint) and fingerprint(definition) != replica.fingerprint
    head = fleet.get(replica.nodes[0]) if replica.nodes else None
    shards = []
    for rank, node_id in enumerate(replica.nodes):
        node = fleet.get(node_id)
        progress = node.load_progress.get(replica.model, "") if node is not None else ""
        shards.append(
            ShardView(
                id=f"{replica.id}/{rank}",
                node=node_id,
                rank=rank,
                gpus=list(replica.gpus.get(node_id, [])),
                state=replica.state,
                error=(replica.error or progress) or None,
            )
        )
    pools = sorted(
        {
            g.gpu_class
            for n in replica.nodes
            if (node := fleet.get(n)) is not None
            for g in node.inventory.gpus
            if g.index in replica.gpus.get(n, [])
        }
    )
    return ReplicaView(
        id=replica.id,
        model=replica.model,
        profile=replica.profile_name,
        state=replica.state,
        restart=replica.restart or None,
        stale=stale or None,
        pool=",".join(pools) or ("cpu" if not any(replica.gpus.values()) else None),
        endpoint=head.address if head is not None else None,
        age_seconds=_seconds(replica.started, now),
        idle_seconds=idle_seconds(desk, replica, now),
        error=replica.error or replica.restart_waits or None,  # the spec's one reason field says why a restart waits
        shards=shards,
    )


def summary(models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk) -> Summary:
    now = time.monotonic()
    nodes = list(fleet)
    unreachable = {n.id for n in nodes if now - n.last_heartbeat > HEARTBEAT_MAX_AGE or n.goodbye}
    cordoned = sum(1 for n in nodes if n.cordoned and n.id not in unreachable)
    draining = sum(1 for n in nodes if n.drained and n.id not in unreachable)
    totals = NodeTotals(
        total=len(nodes),
        ready=len(nodes) - len(unreachable) - cordoned - draining,
        cordoned=cordoned,
        draining=draining,
        unreachable=len(unreachable),
    )
    replicas = list(desk.replica_list())
    held = {
        (n, i)
        for r in replicas
        if r.state in ("starting", "ready", "draining")
        for n, ids in r.gpus.items()
        for i in ids
    }
    classes: dict[str, list[int]] = {}
    """GPU class → [total, used, unhealthy]: counted in plain ints, one wire object per class at the end."""
    for node in nodes:
        for gpu in node.inventory.gpus:
            use = classes.get(gpu.gpu_class)
            if use is None:
                use = classes[gpu.gpu_class] = [0, 0, 0]
            use[0] += 1
            if not gpu.healthy:
                use[2] += 1
            elif (node.id, gpu.index) in held:
                use[1] += 1
    counts = {
        state: sum(1 for r in replicas if r.state == state) for state in ("ready", "starting", "draining", "failed")
    }
    active = [m for m in models if not m.removed]
    satisfied = 0
    for model in active:
        if model.definition is not None:
            satisfied += model.status.ready >= model.status.desired
        else:
            satisfied += not model.wants_loaded() or fleet.serves(model.id, now)
    idle = []
    for replica in replicas:
        seconds = idle_seconds(desk, replica, now) if replica.state == "ready" else -1
        if replica.state == "ready" and (seconds < 0 and now - replica.ready_at > IDLE_AFTER or seconds > IDLE_AFTER):
            idle.append(
                IdleReplica(
                    id=replica.id,
                    model=replica.model,
                    gpus=sum(len(v) for v in replica.gpus.values()),
                    idle_seconds=seconds if seconds >= 0 else _seconds(replica.ready_at, now),
                )
            )
    parked = [ParkedModel(model=m, failures=f, reason=r or None) for m, f, r in desk.parked()]
    return Summary(
        version=__version__,
        nodes=totals,
        gpus=[
            ClassUse(class_=k, total=classes[k][0], used=classes[k][1], unhealthy=classes[k][2])
            for k in sorted(classes)
        ]
        or None,
        fabrics=fabric_uses(nodes, {n for n, _ in held}, now) or None,
        replicas=ReplicaTotal(**counts),
        models=ModelTotals(total=len(active), satisfied=satisfied, short=len(active) - satisfied),
        unplaceable=sorted(m.id for m in active if m.status.unplaceable) or None,
        parked=parked or None,
        idle_replicas=idle or None,
    )
