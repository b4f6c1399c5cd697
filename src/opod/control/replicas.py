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
from opod.control.restarts import restart
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
        return restart(models, desk, body)

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
