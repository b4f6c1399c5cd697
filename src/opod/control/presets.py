"""``/api/v1/presets``: opod's bundled catalog offered as the models that come with it.

What fits, the ``presets.auto`` switch and adding one are
:class:`~opod.fleet.presets_service.PresetsService`'s; the handlers here parse, call it, answer.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.models import ModelAdded, PresetsAutoRequest, PresetsView
from opod.control.audit import audit_draft
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.fleet.presets_service import PresetsService
from opod.store.audit import AuditDraft


def router(presets: PresetsService) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/presets", operation_id="getPresets", tags=["presets"], response_model=PresetsView)
    async def get_presets() -> PresetsView:
        return await presets.view()

    @api.put("/api/v1/presets/auto", operation_id="putPresetsAuto", tags=["presets"], response_model=PresetsView)
    async def put_presets_auto(body: PresetsAutoRequest, draft: AuditDraft = Depends(audit_draft)) -> PresetsView:
        if body.on is None:
            raise ControlError(
                400, 'on: required; true adds a preset when a node fits it, false stops that ({"on": true})'
            )
        return await presets.set_auto(body.on, draft)

    @api.post("/api/v1/presets/{name}", operation_id="postPresetsName", tags=["presets"], response_model=ModelAdded)
    async def post_presets_name(name: str, draft: AuditDraft = Depends(audit_draft)) -> ModelAdded:
        return ModelAdded(added=await presets.add(name, draft))

    return api
