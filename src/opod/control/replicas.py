"""``/api/v1/replicas``, ``/restart``, ``/models/{name}/retry`` and ``/summary``: the reconciler's replicas, for operators.

Everything here is read from the leader's memory (the fleet and the
reconciler's replicas), never the store: a summary of two hundred nodes is an
aggregate over the same facts the node and replica tables show; ``fabrics`` is
one ``FabricUse`` per fabric the nodes declare (``control.node_views.fabric_uses``).
Parts opod has no such thing of (store members, control planes, judges) are left
out rather than invented.
"""

from __future__ import annotations

import time

from fastapi import APIRouter

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
    RestartRequest,
    RestartResult,
    ShardView,
    Summary,
)
from opod.contract.admin.models import RetryView
from opod.control.context import ControlContext, ControlError, ReplicaDesk, ReplicaRecord
from opod.control.node_views import fabric_uses
from opod.control.spec import SpecRouter
from opod.fleet.liveness import HEARTBEAT_MAX_AGE

IDLE_AFTER = 300.0
"""Seconds without a request before a ready replica counts among the summary's idle ones."""


def _desk(ctx: ControlContext) -> ReplicaDesk:
    return ctx.reconciler


def _seconds(since: float, now: float) -> int:
    return max(int(now - since), 0)


def idle_seconds(desk: ReplicaDesk, replica: ReplicaRecord, now: float) -> int:
    """Seconds since a request asked for the replica's model (or since it became ready, if later); -1 = none asked yet."""
    last = desk.last_request(replica.model)
    if last is None:
        return -1
    return _seconds(max(last, replica.ready_at), now)


def replica_view(ctx: ControlContext, desk: ReplicaDesk, replica: ReplicaRecord, now: float) -> ReplicaView:
    model = ctx.models.get(replica.model)
    definition = model.definition if model is not None else None
    stale = definition is not None and bool(replica.fingerprint) and fingerprint(definition) != replica.fingerprint
    head = ctx.fleet.get(replica.nodes[0]) if replica.nodes else None
    shards = []
    for rank, node_id in enumerate(replica.nodes):
        node = ctx.fleet.get(node_id)
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
            if (node := ctx.fleet.get(n)) is not None
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
        error=replica.error or None,
        shards=shards,
    )


def summary(ctx: ControlContext) -> Summary:
    now = time.monotonic()
    desk = ctx.reconciler
    nodes = list(ctx.fleet)
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
    active = [m for m in ctx.models if not m.removed]
    satisfied = 0
    for model in active:
        if model.definition is not None:
            satisfied += model.status.ready >= model.status.desired
        else:
            satisfied += not model.wants_loaded() or ctx.fleet.serves(model.id, now)
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


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/replicas", operation_id="getReplicas", tags=["replicas"], response_model=list[ReplicaView])
    async def get_replicas(model: str | None = None) -> list[ReplicaView]:
        desk = _desk(ctx)
        now = time.monotonic()
        if model and ctx.models.get(model) is None:
            raise ControlError(404, f"model: {model!r} is not in the catalog; GET /api/v1/models lists the models")
        return [replica_view(ctx, desk, r, now) for r in desk.replica_list() if not model or r.model == model]

    @api.post(
        "/api/v1/restart", operation_id="postRestart", tags=["restart"], response_model=RestartResult, status_code=202
    )
    async def post_restart(body: RestartRequest) -> RestartResult:
        desk = _desk(ctx)
        for field, value in (("max_surge", body.max_surge), ("max_unavailable", body.max_unavailable)):
            if value is not None and value < 0:
                raise ControlError(
                    400, f"{field}: {value} is negative; give 0 or more (both 0: one at a time, replaced beside itself)"
                )
        if not (body.replicas or body.models or body.all):
            raise ControlError(
                400, "replicas, models or all: name what to restart (replica ids, model names, or all: true)"
            )
        current = {r.id: r for r in desk.replica_list()}
        for replica_id in body.replicas or []:
            if replica_id not in current:
                raise ControlError(404, f"replicas: {replica_id!r} is not a replica; GET /api/v1/replicas lists them")
        for name in body.models or []:
            if ctx.models.active(name) is None:
                raise ControlError(404, f"models: {name!r} is not in the catalog; GET /api/v1/models lists the models")
        chosen = [
            r.id
            for r in current.values()
            if body.all
            and r.state == "ready"
            or r.id in (body.replicas or [])
            or r.model in (body.models or [])
            and r.state in ("starting", "ready")
        ]
        queued = desk.queue_restart(
            chosen,
            in_place=bool(body.in_place),
            max_surge=body.max_surge or 0,
            max_unavailable=body.max_unavailable or 0,
        )
        return RestartResult(queued=queued)

    @api.post(
        "/api/v1/models/{name}/retry", operation_id="postModelsNameRetry", tags=["models"], response_model=RetryView
    )
    async def post_models_name_retry(name: str) -> RetryView:
        desk = _desk(ctx)
        if ctx.models.active(name) is None:
            raise ControlError(404, f"model {name!r} is not in the catalog; GET /api/v1/models lists the models")
        return RetryView(was_parked=desk.retry(name))

    @api.get("/api/v1/summary", operation_id="getSummary", tags=["summary"], response_model=Summary)
    async def get_summary() -> Summary:
        return summary(ctx)

    return api
