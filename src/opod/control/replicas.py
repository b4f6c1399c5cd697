"""``/api/v1/replicas``, ``/restart``, ``/models/{name}/retry`` and ``/summary``: the reconciler's replicas, for operators.

The views are :mod:`opod.control.replica_views`' (read from the leader's memory, never the store).
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from opod.contract.admin.fleet import ReplicaView, RestartRequest, RestartResult, Summary
from opod.contract.admin.models import RetryView
from opod.control.context import ControlError, ReplicaDesk
from opod.control.replica_views import replica_view, summary
from opod.control.spec import SpecRouter
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet


def router(models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/replicas", operation_id="getReplicas", tags=["replicas"], response_model=list[ReplicaView])
    async def get_replicas(model: str | None = None) -> list[ReplicaView]:
        now = time.monotonic()
        if model and models.get(model) is None:
            raise ControlError(404, f"model: {model!r} is not in the catalog; GET /api/v1/models lists the models")
        return [replica_view(models, fleet, desk, r, now) for r in desk.replica_list() if not model or r.model == model]

    @api.post(
        "/api/v1/restart", operation_id="postRestart", tags=["restart"], response_model=RestartResult, status_code=202
    )
    async def post_restart(body: RestartRequest) -> RestartResult:
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

    @api.post(
        "/api/v1/models/{name}/retry", operation_id="postModelsNameRetry", tags=["models"], response_model=RetryView
    )
    async def post_models_name_retry(name: str) -> RetryView:
        if models.active(name) is None:
            raise ControlError(404, f"model {name!r} is not in the catalog; GET /api/v1/models lists the models")
        return RetryView(was_parked=desk.retry(name))

    @api.get("/api/v1/summary", operation_id="getSummary", tags=["summary"], response_model=Summary)
    async def get_summary() -> Summary:
        return summary(models, fleet, desk)

    return api
