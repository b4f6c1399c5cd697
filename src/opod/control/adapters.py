"""``POST /api/v1/models/{name}/adapters``: a model's LoRA adapters, replaced whole.

A thin handler over :class:`~opod.fleet.adapters_service.AdaptersService`, which has every adapter's files read
by the workers serving the model and judged before the list is kept and attached; it answers the list in force.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.models import AdaptersRequest
from opod.control.audit import audit_draft
from opod.control.spec import SpecRouter
from opod.fleet.adapters_service import AdaptersService
from opod.fleet.models import definition_of
from opod.store.audit import AuditDraft


def router(service: AdaptersService) -> APIRouter:
    api = SpecRouter()

    @api.post(
        "/api/v1/models/{name}/adapters",
        operation_id="postModelsNameAdapters",
        tags=["models"],
        response_model=AdaptersRequest,
    )
    async def post_models_name_adapters(
        name: str, body: AdaptersRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> AdaptersRequest:
        """Each new file is read first, to check it is an adapter for the model's architecture."""
        model = await service.replace(name, body.adapters or [], draft)
        return AdaptersRequest(adapters=definition_of(model).adapters or [])

    return api
