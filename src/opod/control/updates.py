"""``/api/v1/updates``, ``/updates/check`` and ``/models/{name}/update|rollback|origin``: models moved to newer weights.

Everything is the updates service's (:class:`~opod.control.updating.Updates`); the handlers parse, call it, answer.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.models import (
    CheckRequest,
    ModelserveChange,
    ModelserveJob,
    ModelserveUpdateInfo,
    OriginRequest,
    OriginView,
    Result,
)
from opod.control.audit import audit_draft
from opod.control.context import Updating
from opod.control.spec import SpecRouter
from opod.store.audit import AuditDraft


def router(updates: Updating) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/updates", operation_id="getUpdates", tags=["updates"], response_model=list[ModelserveUpdateInfo])
    async def get_updates() -> list[ModelserveUpdateInfo]:
        return await updates.infos()

    @api.post(
        "/api/v1/updates/check",
        operation_id="postUpdatesCheck",
        tags=["updates"],
        response_model=list[ModelserveUpdateInfo],
    )
    async def post_updates_check(
        body: CheckRequest | None = None, draft: AuditDraft = Depends(audit_draft)
    ) -> list[ModelserveUpdateInfo]:
        return await updates.check(body.model if body is not None else None)

    @api.post(
        "/api/v1/models/{name}/update",
        operation_id="postModelsNameUpdate",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_update(
        name: str, body: ModelserveChange | None = None, draft: AuditDraft = Depends(audit_draft)
    ) -> ModelserveJob:
        return await updates.update(name, body, draft)

    @api.post(
        "/api/v1/models/{name}/rollback", operation_id="postModelsNameRollback", tags=["models"], response_model=Result
    )
    async def post_models_name_rollback(name: str, draft: AuditDraft = Depends(audit_draft)) -> Result:
        return Result(result=await updates.rollback(name, draft))

    @api.post(
        "/api/v1/models/{name}/origin", operation_id="postModelsNameOrigin", tags=["models"], response_model=OriginView
    )
    async def post_models_name_origin(
        name: str, body: OriginRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> OriginView:
        return await updates.set_origin(name, body.repo, draft)

    return api
