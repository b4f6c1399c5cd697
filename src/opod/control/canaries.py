"""``/api/v1/models/{name}/canary``, ``/api/v1/canaries`` and ``/api/v1/models/{name}/promote``: models' canaries.

Thin handlers over :class:`~opod.fleet.canaries_service.CanariesService`, which checks each change,
writes it with its audit row, and moves the gateway's split with it. A canary at 0 percent runs
the candidate in shadow (a copy of each request, its answer discarded).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import (
    CanaryPercentRequest,
    ModelserveCanaryView,
    ModelserveChange,
    ModelserveJob,
    Result,
)
from opod.control.audit import audit_draft
from opod.control.spec import SpecRouter
from opod.fleet.canaries_service import CanariesService
from opod.store.audit import AuditDraft


def router(service: CanariesService) -> APIRouter:
    api = SpecRouter()

    @api.get(
        "/api/v1/canaries", operation_id="getCanaries", tags=["canaries"], response_model=list[ModelserveCanaryView]
    )
    async def get_canaries() -> list[ModelserveCanaryView]:
        """Every canary, and how its two sides served since it was last set or changed."""
        return service.views()

    @api.post(
        "/api/v1/models/{name}/canary",
        operation_id="postModelsNameCanary",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_canary(
        name: str, body: CatalogCanary, draft: AuditDraft = Depends(audit_draft)
    ) -> ModelserveJob:
        return await service.start(name, body, draft)

    @api.put("/api/v1/models/{name}/canary", operation_id="putModelsNameCanary", tags=["models"], response_model=Result)
    async def put_models_name_canary(
        name: str, body: CanaryPercentRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> Result:
        return Result(result=await service.set_percent(name, body.percent, draft))

    @api.delete(
        "/api/v1/models/{name}/canary", operation_id="deleteModelsNameCanary", tags=["models"], response_model=Result
    )
    async def delete_models_name_canary(name: str, draft: AuditDraft = Depends(audit_draft)) -> Result:
        return Result(result=await service.remove(name, draft))

    @api.post(
        "/api/v1/models/{name}/promote",
        operation_id="postModelsNamePromote",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_promote(
        name: str, body: ModelserveChange | None = None, draft: AuditDraft = Depends(audit_draft)
    ) -> ModelserveJob:
        return await service.promote(name, body, draft)

    return api
