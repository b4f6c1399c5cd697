"""Presets: opod's bundled catalog (the models with KV sizing) offered as the models that come with it.

A preset fits when some live node could run it: for one that needs a card (its
``hardware.min_vram_gb``), a GPU with at least that much memory, whose class is
listed in ``fits_classes``; for a CPU model (only ``min_ram_gb``), a node with that
much RAM (listed as ``cpu``) or a card that holds as much. Adding a preset adds the bundled entry
as a catalog model (through :class:`~opod.fleet.models_service.ModelsService`); removing that
model marks the preset declined.

With ``presets.auto`` on (off until someone turns it on, so a leader never downloads weights
nobody asked for), :meth:`PresetsService.auto_add` (the leader's loop calls it) adds, for each
kind of output (text, embeddings, rerank) that no catalog model makes yet, the preset that fits:
one tagged ``default`` if it fits, else the largest that fits on one node. Sharded presets are
never added by themselves. Each is recorded in the audit as the leader's own change (actor
``auto``, source ``leader``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opod.catalog import Catalog
from opod.catalog.definition import from_entry
from opod.contract.admin.catalog import CatalogLicense
from opod.contract.admin.models import PresetsView, PresetView
from opod.contract.catalog import Entry
from opod.fleet.inventory import GPUDevice
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.store import PresetRecord, Store
from opod.store.audit import SOURCE_LEADER, AuditDraft
from opod.store.errors import NotFound, StoreError
from opod.store.offloop import run_sync

log = logging.getLogger("opod.fleet")

AUTO = "auto"
"""``added_by`` of a preset the leader added by itself, and the actor of its audit row."""


def makes(capabilities: list[str]) -> str:
    """What a model makes, in the presets' words."""
    if "rerank" in capabilities:
        return "rerank"
    if "embedding" in capabilities and "chat" not in capabilities:
        return "embeddings"
    return "text"


@dataclass(frozen=True, slots=True)
class Offered:
    """What the live nodes offer a preset: the largest healthy card of each GPU class, and the most RAM of a node."""

    card_mb: dict[str, int]
    ram_gb: int | None
    """``None`` when no node is live."""


def largest_cards(gpus: list[GPUDevice]) -> dict[str, int]:
    """GPU class → the memory of the largest healthy card of it among ``gpus``."""
    largest: dict[str, int] = {}
    for gpu in gpus:
        if gpu.healthy and gpu.memory_mb > largest.get(gpu.gpu_class, -1):
            largest[gpu.gpu_class] = gpu.memory_mb
    return largest


def fit(entry: Entry, offered: Offered) -> list[str]:
    """The GPU classes of live cards that meet the preset's memory need, and ``cpu`` when a node has the RAM for a CPU model.

    A preset that states a card's memory (``min_vram_gb``) needs a card; one that states only
    RAM runs on a CPU with that much, or on a card that holds as much.
    """
    need = entry.hardware.min_vram_gb or entry.hardware.min_ram_gb
    # A card sold as 80 GB reports about 81,500 MiB: compared in thousands, so it meets an 80 GB need.
    classes = {gpu_class for gpu_class, mb in offered.card_mb.items() if mb >= need * 1000}
    if not entry.hardware.min_vram_gb and offered.ram_gb is not None and offered.ram_gb >= entry.hardware.min_ram_gb:
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


class PresetsService:
    """The presets as they stand, the ``presets.auto`` switch, and adding one (through the models' writer)."""

    def __init__(
        self, store: Store, models: ModelRegistry, catalog: Catalog, fleet: Fleet, adding: ModelsService
    ) -> None:
        self.store = store
        self.models = models
        self.catalog = catalog
        self.fleet = fleet
        self.adding = adding
        self._cards: dict[str, tuple[list[GPUDevice], dict[str, int]]] = {}
        """node id → (its devices as last seen, their largest cards): worked out again only when a report replaces
        the devices, not on each view of the presets."""

    async def view(self) -> PresetsView:
        """Every preset as it stands in this cluster, and whether the leader adds them by itself."""
        auto = await run_sync(self.store.presets_auto)
        records = {r.name: r for r in await run_sync(self.store.list_presets)}
        views, _ = self._choices(records, auto)
        return PresetsView(auto=auto, presets=views)

    async def set_auto(self, on: bool, audit: AuditDraft) -> PresetsView:
        """Turn the adding of presets by themselves on (adding those that fit now) or off; the presets after."""
        with audit.commit(target="presets.auto") as row:
            await run_sync(self.store.set_presets_auto, on, audit=row)
        if on:
            await self.auto_add()
        return await self.view()

    async def add(self, name: str, audit: AuditDraft) -> str:
        """Add the preset ``name`` as a catalog model, by the draft's actor (clearing a decline); its name.

        ``NotFound`` for a name that is not a preset; ``Conflict`` when the catalog has a model of that name.
        """
        entry = self.catalog.get(name)
        if entry is None:
            raise NotFound(f"{name!r} is not a preset; GET /api/v1/presets lists them")
        await self.adding.add(from_entry(entry), audit, preset_by=audit.actor)
        return entry.id

    async def auto_add(self) -> list[str]:
        """Add the presets that fit a node when ``presets.auto`` is on (the leader's rounds call it); the names added."""
        if not await run_sync(self.store.presets_auto):
            return []
        records = {r.name: r for r in await run_sync(self.store.list_presets)}
        _, adding = self._choices(records, True)
        added = []
        for entry in adding:
            draft = AuditDraft(actor=AUTO, source=SOURCE_LEADER, action=f"POST /api/v1/presets/{entry.id}")
            try:
                await self.adding.add(from_entry(entry), draft, preset_by=AUTO)
            except StoreError as err:  # taken meanwhile, by a person or another leader
                log.info("preset %s not added by itself: %s", entry.id, err)
                continue
            log.info("preset %s added by itself: a node fits it (presets.auto is on)", entry.id)
            added.append(entry.id)
        return added

    def _made(self) -> dict[str, str]:
        """Kind of output → a catalog model that makes it."""
        made: dict[str, str] = {}
        for model in self.models:
            if model.removed:
                continue
            caps = model.capabilities
            for kind, has in (
                ("text", "chat" in caps),
                ("embeddings", "embedding" in caps),
                ("rerank", "rerank" in caps),
            ):
                if has:
                    made.setdefault(kind, model.id)
        return made

    def _offered(self) -> Offered:
        cards: dict[str, tuple[list[GPUDevice], dict[str, int]]] = {}
        card_mb: dict[str, int] = {}
        ram_gb: int | None = None
        for node in self.fleet.live():
            gpus = node.inventory.gpus
            known = self._cards.get(node.id)
            cards[node.id] = known if known is not None and known[0] is gpus else (gpus, largest_cards(gpus))
            for gpu_class, mb in cards[node.id][1].items():
                if mb > card_mb.get(gpu_class, -1):
                    card_mb[gpu_class] = mb
            ram_gb = max(ram_gb or 0, node.hardware.ram_gb)
        self._cards = cards
        return Offered(card_mb, ram_gb)

    def _choices(self, records: dict[str, PresetRecord], auto: bool) -> tuple[list[PresetView], list[Entry]]:
        """Every preset as it stands, and those :meth:`auto_add` would add now."""
        offered = self._offered()
        made = self._made()
        fitting: dict[str, list[Entry]] = {}
        classes: dict[str, list[str]] = {}
        for entry in self.catalog:
            classes[entry.id] = fit(entry, offered)
            record = records.get(entry.id)
            eligible = (
                not (record is not None and record.declined)
                and not entry.sharding.required
                and self.models.active(entry.id) is None
            )
            if classes[entry.id] and eligible:
                fitting.setdefault(makes(entry.capabilities), []).append(entry)
        chosen: dict[str, Entry] = {}
        for kind, entries in fitting.items():
            defaults = [e for e in entries if "default" in e.tags]
            chosen[kind] = (defaults or sorted(entries, key=lambda e: (-e.size_bytes, e.id)))[0]
        views = []
        for entry in self.catalog:
            record = records.get(entry.id)
            kind = makes(entry.capabilities)
            in_catalog = self.models.active(entry.id) is not None
            declined = record is not None and record.declined
            blocked = ""
            if not in_catalog:
                if not auto:
                    blocked = 'presets.auto is off (PUT /api/v1/presets/auto {"on": true})'
                elif not classes[entry.id]:
                    blocked = _need(entry)
                elif declined:
                    blocked = (
                        "declined: it was removed after it was added; POST /api/v1/presets/"
                        + entry.id
                        + " adds it again"
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
