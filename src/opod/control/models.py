"""``/api/v1/models``: the cluster's catalog of models (``catalog.Model``), and opod's load and unload.

A definition is kept whole, as the caller wrote it (its owners as ``kind:ID``), and shown back;
``GET /models/{name}`` answers it with the defaults in force filled in. Every change goes through
:class:`~opod.fleet.models_service.ModelsService`, which checks it whole, writes the store with
its audit row, then memory; the handlers here parse, call it, and shape its answer.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from opod.catalog.definition import class_in_force, scaling_in_force, with_defaults
from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.contract.admin.common import Removed
from opod.contract.admin.models import (
    ClassRequest,
    ClassView,
    FallbacksRequest,
    FallbacksView,
    ModelAdded,
    ModelView,
    OriginView,
    OwnerRequest,
    OwnerView,
    ResourcesRequest,
    ScaleRequest,
    ScaleResponse,
)
from opod.control.audit import audit_draft
from opod.control.context import ReplicaDesk
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.fleet.fallbacks import fallbacks_of
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.store import Wanted
from opod.store.audit import AuditDraft


class PlacementRequest(BaseModel):
    node: str = ""


class PlacementView(BaseModel):
    """What ``load`` and ``unload`` (opod's own) answer: the model, where it is now wanted, and its state."""

    model: str
    wanted: dict[str, str]
    state: str


def warnings(fleet: Fleet, definition: CatalogModel) -> list[str]:
    known = {gpu.gpu_class for node in fleet for gpu in node.inventory.gpus}
    return [
        f"profile {p.name or p.engine or i}: no node has gpu_class {p.gpu_class!r} yet; it is placed once one joins"
        for i, p in enumerate(definition.profiles or [])
        if p.gpu_class and p.gpu_class not in known
    ]


def desired(model: KnownModel) -> int:
    if model.status.desired:
        return model.status.desired
    pinned = sum(1 for node, word in model.wanted.items() if node != ANY_NODE and word == "loaded")
    return pinned or int(model.wanted.get(ANY_NODE) == "loaded")


def view(fleet: Fleet, desk: ReplicaDesk, model: KnownModel) -> ModelView:
    """The model as ``GET /models`` lists it: its definition in force, replicas from the fleet, the reconciler's status."""
    filled = with_defaults(definition_of(model), model.entry, model.engine)
    low, high, _, _ = scaling_in_force(filled)
    status = model.status
    ready = len(fleet.workers_for(model.id))
    holding = len(list(fleet.holders(model.id)))
    phrase = desk.status(model.id)
    reason = status.reason or (phrase if phrase.startswith(("failed", "cannot")) else "")
    first = (filled.profiles or [CatalogProfile()])[0]
    external = filled.external
    origin = filled.origin
    return ModelView(
        name=model.id,
        description=filled.description,
        aliases=filled.aliases,
        source=filled.source,
        role=filled.role,
        min_replicas=low,
        max_replicas=high,
        ready_replicas=ready,
        total_replicas=max(status.total, holding, ready),
        desired_replicas=desired(model),
        failures=status.failures,
        parked=status.parked or None,
        reason=reason or None,
        unplaceable=status.unplaceable or None,
        fallbacks=filled.fallbacks,
        profiles=[p.name or "" for p in filled.profiles or []] or None,
        memory_gb=first.min_memory_gb,
        cpu_cores=first.cpu_cores,
        warnings=warnings(fleet, filled) or None,
        class_=class_in_force(filled),
        owner=filled.owner,
        external=f"{urlsplit(external.url or '').netloc}/{external.model or model.id}"
        if external is not None
        else None,
        adapters=filled.adapters,
        preempted=status.preempted or None,
        held_for=status.held_for or None,
        canary=filled.canary,
        eval=filled.eval,
        origin=OriginView(
            repo=origin.repo,
            revision=origin.revision,
            previous=origin.previous.revision if origin.previous is not None else None,
        )
        if origin is not None
        else None,
    )


def router(service: ModelsService, models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/models", operation_id="getModels", tags=["models"], response_model=list[ModelView])
    async def get_models() -> list[ModelView]:
        return [view(fleet, desk, m) for m in models if not m.removed]

    @api.post("/api/v1/models", operation_id="postModels", tags=["models"], response_model=ModelAdded)
    async def post_models(body: CatalogModel, draft: AuditDraft = Depends(audit_draft)) -> ModelAdded:
        model = await service.add(body, draft)
        return ModelAdded(added=model.id)

    @api.get("/api/v1/models/{name}", operation_id="getModelsName", tags=["models"], response_model=CatalogModel)
    async def get_models_name(name: str) -> CatalogModel:
        model = service.named(name)
        return with_defaults(definition_of(model), model.entry, model.engine)

    @api.delete("/api/v1/models/{name}", operation_id="deleteModelsName", tags=["models"], response_model=Removed)
    async def delete_models_name(name: str, draft: AuditDraft = Depends(audit_draft)) -> Removed:
        model = await service.remove(name, draft)
        return Removed(removed=model.id)

    @api.post(
        "/api/v1/models/{name}/class", operation_id="postModelsNameClass", tags=["models"], response_model=ClassView
    )
    async def post_models_name_class(
        name: str, body: ClassRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> ClassView:
        model = await service.set_class(name, body.class_ or "", draft)
        return ClassView(model=model.id, class_=class_in_force(definition_of(model)))

    @api.post(
        "/api/v1/models/{name}/owner", operation_id="postModelsNameOwner", tags=["models"], response_model=OwnerView
    )
    async def post_models_name_owner(
        name: str, body: OwnerRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> OwnerView:
        model = await service.set_owner(name, body.owner or "", draft)
        return OwnerView(model=model.id, owner=definition_of(model).owner)

    @api.post(
        "/api/v1/models/{name}/resources",
        operation_id="postModelsNameResources",
        tags=["models"],
        response_model=CatalogModel,
    )
    async def post_models_name_resources(
        name: str, body: ResourcesRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> CatalogModel:
        model = await service.set_resources(
            name, draft, profile=body.profile or "", memory_gb=body.memory_gb, cpu_cores=body.cpu_cores
        )
        return with_defaults(definition_of(model), model.entry, model.engine)

    @api.post(
        "/api/v1/models/{name}/scale", operation_id="postModelsNameScale", tags=["models"], response_model=ScaleResponse
    )
    async def post_models_name_scale(
        name: str, body: ScaleRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> ScaleResponse:
        model = await service.scale(name, draft, low=body.min, high=body.max, idle_timeout=body.idle_timeout)
        low, high, idle, on_demand = scaling_in_force(definition_of(model))
        return ScaleResponse(model=model.id, min=low, max=high, idle_timeout=idle, on_demand=on_demand)

    @api.put(
        "/api/v1/models/{name}/fallbacks",
        operation_id="putModelsNameFallbacks",
        tags=["models"],
        response_model=FallbacksView,
    )
    async def put_models_name_fallbacks(
        name: str, body: FallbacksRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> FallbacksView:
        model = await service.set_fallbacks(name, body.fallbacks or [], draft)
        return FallbacksView(model=model.id, fallbacks=fallbacks_of(model))

    # --- opod's own: pin a model to a node, or take it off one ---------------------------------

    @api.post(
        "/api/v1/models/{name}/load",
        operation_id="postModelsNameLoad",
        tags=[EXTENSION_TAG],
        response_model=PlacementView,
    )
    async def load(
        name: str, body: PlacementRequest | None = None, draft: AuditDraft = Depends(audit_draft)
    ) -> PlacementView:
        return await place(name, body, "loaded", draft)

    @api.post(
        "/api/v1/models/{name}/unload",
        operation_id="postModelsNameUnload",
        tags=[EXTENSION_TAG],
        response_model=PlacementView,
    )
    async def unload(
        name: str, body: PlacementRequest | None = None, draft: AuditDraft = Depends(audit_draft)
    ) -> PlacementView:
        return await place(name, body, "unloaded", draft)

    @api.get("/api/v1/model-states", operation_id="getModelStates", tags=[EXTENSION_TAG], response_model=dict[str, str])
    async def get_model_states() -> dict[str, str]:
        """Each model's state in words (``serving on n1``, ``loading on n1 (40%)``, ``failed on n1: ...``), for listings."""
        return {m.id: desk.status(m.id) for m in models if not m.removed}

    async def place(name: str, body: PlacementRequest | None, wanted: Wanted, draft: AuditDraft) -> PlacementView:
        model = await service.pin(name, (body.node if body else "") or ANY_NODE, wanted, draft)
        return PlacementView(model=model.id, wanted=dict(model.wanted), state=desk.status(model.id))

    return api
