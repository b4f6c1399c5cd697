"""A rolling restart as ``POST /api/v1/restart`` asks it: its checks, the replicas it takes, and the reconciler's queue.

The management API's route and the console's model page both restart through :func:`restart`, so a
restart asked on either checks and chooses the same way.
"""

from __future__ import annotations

from opod.contract.admin.fleet import RestartRequest, RestartResult
from opod.control.context import ControlError, ReplicaDesk
from opod.fleet.models import ModelRegistry


def restart(models: ModelRegistry, desk: ReplicaDesk, body: RestartRequest) -> RestartResult:
    """Queue the replicas ``body`` names (by id, by model, or all ready ones) for a rolling restart; 400 or 404 first."""
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
        if models.active(name) is None:
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
