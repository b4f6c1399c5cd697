"""``/api/v1/models``: the cluster's catalog of models (``catalog.Model``), and opod's load and unload.

A definition is kept whole, as the caller wrote it, and shown back; ``GET
/models/{name}`` answers it with the defaults in force filled in. A definition is
checked whole before anything is written (:mod:`opod.catalog.definition`), and
each change is written to the store first, in one transaction, then to the
leader's memory, so a refusal leaves both as they were. The weights a worker
fetches come from the definition's source (or the bundled entry of that name),
as the opod catalog entry ``KnownModel.entry``.

Until the placement reconciler reads scaling, a model with replicas wanted is
wanted ``loaded`` on any worker: adding one with ``scaling.min`` 0 (or scaling it
to 0) leaves it unloaded. ``load`` and ``unload`` (opod's own) pin it to a node.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from pydantic import BaseModel

from opod.catalog.definition import (
    DefinitionError,
    class_in_force,
    class_problem,
    derived_name,
    entry_for,
    owner_problem,
    problems,
    scaling_in_force,
    with_defaults,
)
from opod.contract.admin.catalog import CatalogModel, CatalogProfile, CatalogScaling
from opod.contract.admin.common import Removed
from opod.contract.admin.models import (
    ClassRequest,
    ClassView,
    ModelAdded,
    ModelView,
    OriginView,
    OwnerRequest,
    OwnerView,
    ResourcesRequest,
    ScaleRequest,
    ScaleResponse,
)
from opod.control.context import ControlContext, ControlError
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.engines.registry import DRIVERS
from opod.fleet.models import ANY_NODE, KnownModel
from opod.store import Wanted
from opod.store.offloop import run_sync

ENGINES = frozenset(name for d in DRIVERS for name in (d.id, *d.aliases))
"""Engine names a profile may give: every driver's id and aliases."""


class PlacementRequest(BaseModel):
    node: str = ""


class PlacementView(BaseModel):
    """What ``load`` and ``unload`` (opod's own) answer: the model, where it is now wanted, and its state."""

    model: str
    wanted: dict[str, str]
    state: str


def actor(request: Request) -> str:
    """Who the change is recorded as made by (the listener has checked the header's form)."""
    return request.headers.get("x-llmgw-actor") or "unknown"


def definition_of(model: KnownModel) -> CatalogModel:
    return model.definition if model.definition is not None else CatalogModel(name=model.id)


def dump(definition: CatalogModel) -> str:
    return definition.model_dump_json(exclude_none=True, by_alias=True)


def single_engine(definition: CatalogModel) -> str:
    """The engine every profile names, when they name one: workers running another are not chosen."""
    engines = {(p.engine or "").strip().lower() for p in definition.profiles or []}
    return engines.pop() if len(engines) == 1 else ""


def wanted_for(definition: CatalogModel) -> Wanted | None:
    """What is wanted on any worker: loaded while it should have replicas, else unloaded; nothing for an external model."""
    if definition.external is not None:
        return None
    return "loaded" if scaling_in_force(definition)[0] > 0 else "unloaded"


def refuse_problems(found: list[str]) -> None:
    if found:
        raise ControlError(400, "; ".join(found))


def name_conflicts(ctx: ControlContext, definition: CatalogModel, own: str = "") -> None:
    """409 when the name or an alias is another model's name or alias."""
    names = [definition.name or "", *(definition.aliases or [])]
    for other in ctx.models:
        if other.removed or other.id == own:
            continue
        theirs = {other.id, *(definition_of(other).aliases or [])}
        for i, name in enumerate(names):
            if name in theirs:
                field = "name" if i == 0 else f"aliases[{i - 1}]"
                raise ControlError(
                    409,
                    f"{field}: {name!r} is already a name of model {other.id!r}; choose another, "
                    f"or remove {other.id!r} first",
                )


async def add_model(ctx: ControlContext, definition: CatalogModel, *, preset_by: str | None = None) -> KnownModel:
    """Check a whole definition, then keep it: the store in one transaction, then memory."""
    if not definition.name and definition.source:
        definition = definition.model_copy(update={"name": derived_name(definition.source)})
    refuse_problems(problems(definition, ENGINES))
    name = definition.name or ""
    if ctx.models.active(name) is not None:
        raise ControlError(
            409,
            f"name: model {name!r} is already in the catalog; change it (scale, resources, class, owner) "
            "or remove it first, or choose another name",
        )
    name_conflicts(ctx, definition)
    try:
        entry, bundled = entry_for(definition, ctx.catalog.get(name))
    except DefinitionError as err:
        close = difflib.get_close_matches(name, ctx.catalog.ids(), n=3, cutoff=0.5) if not definition.source else []
        raise ControlError(400, str(err) + (f". Did you mean {', '.join(close)}?" if close else "")) from None
    engine = single_engine(definition)
    wanted = (
        wanted_for(definition) if wanted_for(definition) == "loaded" else None
    )  # added without replicas: placed nowhere yet
    await run_sync(
        ctx.store.add_model,
        name,
        source_json=entry.source.to_json() if entry is not None else "{}",
        entry_json=None if bundled or entry is None else entry.to_json(),
        engine=engine,
        definition_json=dump(definition),
        wanted=wanted,
        preset_by=preset_by,
    )
    model = KnownModel(id=name, entry=entry, engine=engine, definition=definition)
    if wanted is not None:
        model.wanted[ANY_NODE] = wanted
    ctx.models.put(model)
    ctx.reconciler.kick()
    return model


def gpu_classes(ctx: ControlContext) -> set[str]:
    return {gpu.gpu_class for node in ctx.fleet for gpu in node.inventory.gpus}


def warnings(ctx: ControlContext, definition: CatalogModel) -> list[str]:
    known = gpu_classes(ctx)
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


def view(ctx: ControlContext, model: KnownModel) -> ModelView:
    """The model as ``GET /models`` lists it: its definition in force, replicas from the fleet, the reconciler's status."""
    filled = with_defaults(definition_of(model), model.entry, model.engine)
    low, high, _, _ = scaling_in_force(filled)
    status = model.status
    ready = len(ctx.fleet.workers_for(model.id))
    holding = len(list(ctx.fleet.holders(model.id)))
    phrase = ctx.reconciler.status(model.id)
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
        warnings=warnings(ctx, filled) or None,
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


def known(ctx: ControlContext, name: str) -> KnownModel:
    model = ctx.models.named(name)
    if model is None:
        raise ControlError(
            404, f"model {name!r} is not in the catalog; GET /api/v1/models lists them, POST /api/v1/models adds one"
        )
    return model


async def redefine(
    ctx: ControlContext, model: KnownModel, definition: CatalogModel, *, rescale: bool = False
) -> CatalogModel:
    """Replace a model's definition after checking it whole; with ``rescale``, what is wanted on any worker follows its scaling."""
    refuse_problems(problems(definition, ENGINES))
    wanted = wanted_for(definition) if rescale else None
    engine = single_engine(definition)
    await run_sync(ctx.store.set_definition, model.id, dump(definition), engine=engine, wanted=wanted)
    model.definition = definition
    model.engine = engine
    if wanted == "unloaded":
        model.wanted = dict.fromkeys({ANY_NODE, *model.wanted}, "unloaded")
    elif wanted is not None:
        model.wanted[ANY_NODE] = wanted
    ctx.reconciler.kick()
    return definition


def with_resources(definition: CatalogModel, entry_engine: str, body: ResourcesRequest) -> CatalogModel:
    profiles = list(definition.profiles or []) or [CatalogProfile(engine=entry_engine or None)]
    filled = with_defaults(definition.model_copy(update={"profiles": profiles}), None).profiles or []
    names = [p.name for p in filled]
    if body.profile and body.profile not in names:
        raise ControlError(
            404,
            f"profile: {body.profile!r} is not a profile of {definition.name!r}; it has {', '.join(map(str, names))}",
        )
    changed: list[CatalogProfile] = []
    for profile, name in zip(profiles, names, strict=True):
        if not body.profile or body.profile == name:
            update: dict[str, object] = {"name": name}
            if body.memory_gb is not None:
                update["min_memory_gb"] = body.memory_gb
            if body.cpu_cores is not None:
                update["cpu_cores"] = body.cpu_cores
            profile = profile.model_copy(update=update)
        changed.append(profile)
    return definition.model_copy(update={"profiles": changed})


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/models", operation_id="getModels", tags=["models"], response_model=list[ModelView])
    async def get_models() -> list[ModelView]:
        return [view(ctx, m) for m in ctx.models if not m.removed]

    @api.post("/api/v1/models", operation_id="postModels", tags=["models"], response_model=ModelAdded)
    async def post_models(body: CatalogModel) -> ModelAdded:
        model = await add_model(ctx, body)
        return ModelAdded(added=model.id)

    @api.get("/api/v1/models/{name}", operation_id="getModelsName", tags=["models"], response_model=CatalogModel)
    async def get_models_name(name: str) -> CatalogModel:
        model = known(ctx, name)
        return with_defaults(definition_of(model), model.entry, model.engine)

    @api.delete("/api/v1/models/{name}", operation_id="deleteModelsName", tags=["models"], response_model=Removed)
    async def delete_models_name(name: str) -> Removed:
        model = known(ctx, name)
        if model.id in ctx.declared_models:
            raise ControlError(
                409,
                f"{model.id!r} is the leader's built-in default model, declared by its settings, so it stays in the "
                f"catalog; to stop serving it, scale it to 0 (POST /api/v1/models/{model.id}/scale "
                '{"min": 0}), or start the leader with --no-default-models',
            )
        await run_sync(ctx.store.remove_model, model.id)
        model.wanted = {ANY_NODE: "unloaded"}
        model.removed = True
        ctx.reconciler.kick()
        return Removed(removed=model.id)

    @api.post(
        "/api/v1/models/{name}/class", operation_id="postModelsNameClass", tags=["models"], response_model=ClassView
    )
    async def post_models_name_class(name: str, body: ClassRequest) -> ClassView:
        model = known(ctx, name)
        refuse_problems([p for p in [class_problem(body.class_)] if p])
        definition = await redefine(ctx, model, definition_of(model).model_copy(update={"class_": body.class_ or None}))
        return ClassView(model=model.id, class_=class_in_force(definition))

    @api.post(
        "/api/v1/models/{name}/owner", operation_id="postModelsNameOwner", tags=["models"], response_model=OwnerView
    )
    async def post_models_name_owner(name: str, body: OwnerRequest) -> OwnerView:
        model = known(ctx, name)
        refuse_problems([p for p in [owner_problem(body.owner)] if p])
        definition = await redefine(ctx, model, definition_of(model).model_copy(update={"owner": body.owner or None}))
        return OwnerView(model=model.id, owner=definition.owner)

    @api.post(
        "/api/v1/models/{name}/resources",
        operation_id="postModelsNameResources",
        tags=["models"],
        response_model=CatalogModel,
    )
    async def post_models_name_resources(name: str, body: ResourcesRequest) -> CatalogModel:
        model = known(ctx, name)
        for field, value in (("memory_gb", body.memory_gb), ("cpu_cores", body.cpu_cores)):
            if value is not None and value < 0:
                raise ControlError(400, f"{field}: {value} cannot be negative (0 reserves nothing)")
        entry_engine = model.engine or (model.entry.recommended_engines[0] if model.entry is not None else "")
        definition = await redefine(ctx, model, with_resources(definition_of(model), entry_engine, body))
        return with_defaults(definition, model.entry, model.engine)

    @api.post(
        "/api/v1/models/{name}/scale", operation_id="postModelsNameScale", tags=["models"], response_model=ScaleResponse
    )
    async def post_models_name_scale(name: str, body: ScaleRequest) -> ScaleResponse:
        model = known(ctx, name)
        current = definition_of(model)
        low = body.min if body.min is not None else scaling_in_force(current)[0]
        scaling = (current.scaling or CatalogScaling()).model_copy(
            update={
                "min": low,
                "max": body.max,  # a max left out follows min
                "idle_timeout": body.idle_timeout
                if body.idle_timeout is not None
                else (current.scaling.idle_timeout if current.scaling else None),
            }
        )
        definition = await redefine(ctx, model, current.model_copy(update={"scaling": scaling}), rescale=True)
        low, high, idle, on_demand = scaling_in_force(definition)
        return ScaleResponse(model=model.id, min=low, max=high, idle_timeout=idle, on_demand=on_demand)

    # --- opod's own: pin a model to a node, or take it off one ---------------------------------

    @api.post(
        "/api/v1/models/{name}/load",
        operation_id="postModelsNameLoad",
        tags=[EXTENSION_TAG],
        response_model=PlacementView,
    )
    async def load(name: str, body: PlacementRequest | None = None) -> PlacementView:
        return await place(name, (body.node if body else "") or ANY_NODE, "loaded")

    @api.post(
        "/api/v1/models/{name}/unload",
        operation_id="postModelsNameUnload",
        tags=[EXTENSION_TAG],
        response_model=PlacementView,
    )
    async def unload(name: str, body: PlacementRequest | None = None) -> PlacementView:
        return await place(name, (body.node if body else "") or ANY_NODE, "unloaded")

    @api.get("/api/v1/model-states", operation_id="getModelStates", tags=[EXTENSION_TAG], response_model=dict[str, str])
    async def get_model_states() -> dict[str, str]:
        """Each model's state in words (``serving on n1``, ``loading on n1 (40%)``, ``failed on n1: ...``), for listings."""
        return {m.id: ctx.reconciler.status(m.id) for m in ctx.models if not m.removed}

    async def place(name: str, node: str, wanted: Wanted) -> PlacementView:
        model = known(ctx, name)
        if node != ANY_NODE and ctx.fleet.get(node) is None:
            raise ControlError(404, f"node {node!r} is not known; `opod node ls` lists them")
        if node == ANY_NODE and model.definition is not None:
            # Anywhere is the definition's scaling: unload is no replicas (min 0), load at least one.
            current = model.definition
            scaling = current.scaling or CatalogScaling()
            low, high, _, _ = scaling_in_force(current)
            if wanted == "unloaded" and (low or high):
                scaling = scaling.model_copy(update={"min": 0, "max": None, "schedule": None})
            elif wanted == "loaded" and not low:
                scaling = scaling.model_copy(update={"min": 1, "max": high if high >= 1 else None})
            await redefine(ctx, model, current.model_copy(update={"scaling": scaling}), rescale=True)
            return PlacementView(model=model.id, wanted=dict(model.wanted), state=ctx.reconciler.status(model.id))
        targets: Iterable[str] = [node] if node != ANY_NODE or wanted == "loaded" else sorted({ANY_NODE, *model.wanted})
        for target in targets:
            await run_sync(ctx.store.set_placement, model.id, target, wanted)
            model.wanted[target] = wanted
        ctx.reconciler.kick()
        return PlacementView(model=model.id, wanted=dict(model.wanted), state=ctx.reconciler.status(model.id))

    return api
