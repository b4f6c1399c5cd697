"""What a leader reads from the store once, at start: its nodes, its models (the CPU defaults on a first start) and
the gangs of its sharded models. From then on the request path reads memory only."""

from __future__ import annotations

import json
import logging

from opod.catalog import Catalog
from opod.catalog.definition import from_entry
from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogModel, CatalogScaling
from opod.contract.catalog import Entry
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.leader.nodes import restored
from opod.shards import ShardError, ShardManager
from opod.store import Store

log = logging.getLogger("opod.leader")

DEFAULT_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2")
"""The CPU defaults a first start adds (unless ``--no-default-models``)."""


def load_nodes(store: Store, fleet: Fleet) -> None:
    """Every node the store knows, into the fleet, as it was when last heard from (no heartbeat yet)."""
    for record in store.list_nodes():
        try:
            hardware = nodeapi.decode_hardware(record.hardware_json)
        except ValueError:
            hardware = nodeapi.Capabilities()
        fleet.restore(
            restored(
                NodeState(
                    id=record.id,
                    address=record.address,
                    hostname=record.hostname,
                    boot_id=record.boot_id,
                    token_id=record.token_id or "",
                    hardware=hardware,
                    drained=record.drained,
                ),
                record,
            )
        )


def load_models(store: Store, catalog: Catalog, models: ModelRegistry, *, default_models: bool) -> None:
    """Every model the store keeps, into the registry; on a first start, the CPU defaults added first."""
    records = store.list_models()
    if not records and default_models and store.get_meta("default_models") is None:
        for model_id in DEFAULT_MODELS:
            entry = catalog.get(model_id)
            if entry is not None:
                store.add_model(
                    model_id,
                    source_json=json.dumps(entry.source.to_wire()),
                    definition_json=from_entry(entry).model_dump_json(exclude_none=True, by_alias=True),
                    wanted="loaded",
                )
        store.set_meta("default_models", "added")
        records = store.list_models()
    placements: dict[str, dict[str, str]] = {}
    for placement in store.list_placements():
        placements.setdefault(placement.model_id, {})[placement.node_id] = placement.wanted
    for record in records:
        entry = Entry.from_wire(record.entry_json) if record.entry_json else catalog.get(record.id)
        wanted = placements.get(record.id, {})
        models.put(
            KnownModel(
                id=record.id,
                entry=entry,
                engine=record.engine,
                wanted=wanted,
                definition=_definition(record.id, record.definition_json, entry, record.engine, wanted),
            )
        )


def _definition(
    model_id: str, saved: str | None, entry: Entry | None, engine: str, wanted: dict[str, str]
) -> CatalogModel:
    """A model's catalog definition: as kept, or, for a model added before definitions were, what its entry and placements say."""
    if saved:
        return CatalogModel.model_validate_json(saved)
    definition = from_entry(entry, engine) if entry is not None else CatalogModel(name=model_id)
    if wanted.get(ANY_NODE) != "loaded":
        definition = definition.model_copy(update={"scaling": CatalogScaling(min=0)})
    return definition


def restore_gangs(store: Store, shards: ShardManager) -> None:
    """The gangs of sharded models kept at the last stop, back in the shard manager."""
    saved = store.get_meta("shards")
    if not saved:
        return
    try:
        shards.from_json(saved)
    except ShardError as err:
        log.error("the saved gangs could not be restored (%s); they must be created again", err)
