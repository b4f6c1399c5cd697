"""``/api/v1/presets``: opod's bundled catalog (the models with KV sizing) as the models that come with it.

A preset fits when some live node could run it: for one that needs a card (its
``hardware.min_vram_gb``), a GPU with at least that much memory, whose class is
listed in ``fits_classes``; for a CPU model (only ``min_ram_gb``), a node with that
much RAM (listed as ``cpu``) or a card that holds as much. Adding a preset adds the bundled entry
as a catalog model; removing that model marks the preset declined.

With ``presets.auto`` on (off until someone turns it on, so a leader never
downloads weights nobody asked for), :func:`auto_add` adds, for each kind of output
(text, embeddings, rerank) that no catalog model makes yet, the preset that fits:
one tagged ``default`` if it fits, else the largest that fits on one node.
Sharded presets are never added by themselves.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request

from opod.catalog.definition import from_entry
from opod.contract.admin.catalog import CatalogLicense
from opod.contract.admin.models import ModelAdded, PresetsAutoRequest, PresetsView, PresetView
from opod.contract.catalog import Entry
from opod.control.context import ControlContext, ControlError
from opod.control.models import actor, add_model
from opod.control.spec import SpecRouter
from opod.fleet.state import NodeState
from opod.store import PresetRecord
from opod.store.offloop import run_sync

log = logging.getLogger("opod.control")

AUTO = "auto"
"""``added_by`` of a preset the leader added by itself."""


def makes(capabilities: list[str]) -> str:
    """What a model makes, in the presets' words."""
    if "rerank" in capabilities:
        return "rerank"
    if "embedding" in capabilities and "chat" not in capabilities:
        return "embeddings"
    return "text"


def fit(entry: Entry, nodes: list[NodeState]) -> list[str]:
    """The GPU classes of live cards that meet the preset's memory need, and ``cpu`` when a node has the RAM for a CPU model.

    A preset that states a card's memory (``min_vram_gb``) needs a card; one that states only
    RAM runs on a CPU with that much, or on a card that holds as much.
    """
    need = entry.hardware.min_vram_gb or entry.hardware.min_ram_gb
    # A card sold as 80 GB reports about 81,500 MiB: compared in thousands, so it meets an 80 GB need.
    classes = {
        gpu.gpu_class for node in nodes for gpu in node.inventory.gpus if gpu.healthy and gpu.memory_mb >= need * 1000
    }
    if not entry.hardware.min_vram_gb and any(node.hardware.ram_gb >= entry.hardware.min_ram_gb for node in nodes):
        classes.add("cpu")
    return sorted(classes)


def _need(entry: Entry) -> str:
    if entry.hardware.min_vram_gb:
        return f"no node has a card with {entry.hardware.min_vram_gb} GB"
    return f"no node has {entry.hardware.min_ram_gb} GB of RAM"


def _card(entry: Entry) -> str | None:
    if entry.source.repo:
        return f"https://huggingface.co/{entry.source.repo}"
    return entry.license_url or None


def _made(ctx: ControlContext) -> dict[str, str]:
    """Kind of output → a catalog model that makes it."""
    made: dict[str, str] = {}
    for model in ctx.models:
        if model.removed:
            continue
        caps = model.capabilities
        for kind, has in (("text", "chat" in caps), ("embeddings", "embedding" in caps), ("rerank", "rerank" in caps)):
            if has:
                made.setdefault(kind, model.id)
    return made


def choices(ctx: ControlContext, records: dict[str, PresetRecord], auto: bool) -> tuple[list[PresetView], list[Entry]]:
    """Every preset as it stands, and those :func:`auto_add` would add now."""
    nodes = ctx.fleet.live()
    made = _made(ctx)
    fitting: dict[str, list[Entry]] = {}
    classes: dict[str, list[str]] = {}
    for entry in ctx.catalog:
        classes[entry.id] = fit(entry, nodes)
        record = records.get(entry.id)
        eligible = (
            not (record is not None and record.declined)
            and not entry.sharding.required
            and ctx.models.active(entry.id) is None
        )
        if classes[entry.id] and eligible:
            fitting.setdefault(makes(entry.capabilities), []).append(entry)
    chosen: dict[str, Entry] = {}
    for kind, entries in fitting.items():
        defaults = [e for e in entries if "default" in e.tags]
        chosen[kind] = (defaults or sorted(entries, key=lambda e: (-e.size_bytes, e.id)))[0]
    views = []
    for entry in ctx.catalog:
        record = records.get(entry.id)
        kind = makes(entry.capabilities)
        in_catalog = ctx.models.active(entry.id) is not None
        declined = record is not None and record.declined
        blocked = ""
        if not in_catalog:
            if not auto:
                blocked = 'presets.auto is off (PUT /api/v1/presets/auto {"on": true})'
            elif not classes[entry.id]:
                blocked = _need(entry)
            elif declined:
                blocked = (
                    "declined: it was removed after it was added; POST /api/v1/presets/" + entry.id + " adds it again"
                )
            elif entry.sharding.required:
                blocked = "it is split across nodes (sharded): add it by hand"
            elif kind in made:
                blocked = f"{made[kind]} already makes {kind}"
            elif chosen.get(kind) is not entry:
                blocked = f"{chosen[kind].id} is added for {kind} instead"
        views.append(
            PresetView(
                name=entry.id,
                makes=kind,
                description=entry.description or None,
                card=_card(entry),
                licence=CatalogLicense(
                    id=entry.license or None, url=entry.license_url or None, commercial=not entry.restricted
                ),
                fits=bool(classes[entry.id]),
                fits_classes=classes[entry.id],
                in_catalog=in_catalog,
                added_by=record.added_by if record is not None and record.added_by else None,
                added_at=record.added_at if record is not None else None,
                declined=declined,
                blocked=blocked or None,
            )
        )
    return views, [e for kind, e in chosen.items() if kind not in made] if auto else []


async def presets_view(ctx: ControlContext) -> PresetsView:
    auto = await run_sync(ctx.store.presets_auto)
    records = {r.name: r for r in await run_sync(ctx.store.list_presets)}
    views, _ = choices(ctx, records, auto)
    return PresetsView(auto=auto, presets=views)


async def add_preset(ctx: ControlContext, entry: Entry, by: str) -> None:
    await add_model(ctx, from_entry(entry), preset_by=by)


async def auto_add(ctx: ControlContext) -> list[str]:
    """Add the presets that fit a node when ``presets.auto`` is on (what the leader's rounds call); the names added."""
    if not await run_sync(ctx.store.presets_auto):
        return []
    records = {r.name: r for r in await run_sync(ctx.store.list_presets)}
    _, adding = choices(ctx, records, True)
    added = []
    for entry in adding:
        try:
            await add_preset(ctx, entry, AUTO)
        except ControlError as err:  # taken meanwhile, by a person or another leader
            log.info("preset %s not added by itself: %s", entry.id, err.message)
            continue
        log.info("preset %s added by itself: a node fits it (presets.auto is on)", entry.id)
        added.append(entry.id)
    return added


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/presets", operation_id="getPresets", tags=["presets"], response_model=PresetsView)
    async def get_presets() -> PresetsView:
        return await presets_view(ctx)

    @api.put("/api/v1/presets/auto", operation_id="putPresetsAuto", tags=["presets"], response_model=PresetsView)
    async def put_presets_auto(body: PresetsAutoRequest) -> PresetsView:
        if body.on is None:
            raise ControlError(
                400, 'on: required; true adds a preset when a node fits it, false stops that ({"on": true})'
            )
        await run_sync(ctx.store.set_presets_auto, body.on)
        if body.on:
            await auto_add(ctx)
        return await presets_view(ctx)

    @api.post("/api/v1/presets/{name}", operation_id="postPresetsName", tags=["presets"], response_model=ModelAdded)
    async def post_presets_name(name: str, request: Request) -> ModelAdded:
        entry = ctx.catalog.get(name)
        if entry is None:
            raise ControlError(404, f"{name!r} is not a preset; GET /api/v1/presets lists them")
        await add_preset(ctx, entry, actor(request))
        return ModelAdded(added=name)

    return api
