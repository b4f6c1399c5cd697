"""The presets without HTTP: what fits the live nodes, the ``presets.auto`` switch with its audit row, a preset added
by a person or by the leader itself (through the models' writer), and a removal that declines it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.tenancy import Tenancy, TenancyScopes
from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.fleet.inventory import apply_report
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.presets_service import AUTO, PresetsService
from opod.fleet.state import Fleet, NodeState
from opod.store import Conflict, NotFound, Store
from opod.store.audit import SOURCE_API, SOURCE_LEADER
from tests.fleet.conftest import Kicks
from tests.fleet.conftest import new_draft as draft


class Presets:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.fleet, self.models, self.kicks = Fleet(), ModelRegistry(), Kicks()
        catalog = load_catalog()
        self.writer = ModelsService(
            store,
            self.models,
            catalog,
            self.fleet,
            self.kicks,
            TenancyScopes(Tenancy.load(store)),
            declared=frozenset(),
        )
        self.service = PresetsService(store, self.models, catalog, self.fleet, self.writer)

    def join_cpu_node(self, ram_gb: int = 16) -> None:
        node = NodeState(id="n1", address="127.0.0.1:1", hardware=nodeapi.Capabilities(CPUCores=8, RAMGB=ram_gb))
        self.fleet.restore(node)
        node.last_heartbeat = time.monotonic()


@pytest.fixture
def presets(tmp_path: Path) -> Iterator[Presets]:
    with Store.open(None, home=tmp_path) as store:
        yield Presets(store)


def test_with_auto_off_nothing_is_added_and_each_preset_says_why(presets: Presets) -> None:
    presets.join_cpu_node()
    view = asyncio.run(presets.service.view())
    assert view.auto is False and view.presets
    assert all((p.blocked or "").startswith("presets.auto is off") for p in view.presets)
    assert any(p.fits and p.fits_classes == ["cpu"] for p in view.presets), "a CPU model fits a node with the RAM"
    assert asyncio.run(presets.service.auto_add()) == [] and presets.models.ids() == []


def test_turning_auto_on_adds_what_fits_as_the_leaders_own_audited_change(presets: Presets) -> None:
    presets.join_cpu_node()
    view = asyncio.run(presets.service.set_auto(True, draft("PUT /api/v1/presets/auto")))
    added = {p.name for p in view.presets or [] if p.added_by == AUTO}
    assert view.auto is True and added and added == set(presets.models.ids())
    assert {r.name for r in presets.store.list_presets() if r.added_by == AUTO} == added
    rows = presets.store.list_audit(limit=100)
    switch = [r for r in rows if r.target == "presets.auto"]
    assert [(r.actor, r.source, r.status) for r in switch] == [("ops@example", SOURCE_API, 200)]
    auto = {r.target: (r.actor, r.source, r.action) for r in rows if r.actor == AUTO}
    assert auto == {f"model:{n}": (AUTO, SOURCE_LEADER, f"POST /api/v1/presets/{n}") for n in added}
    assert asyncio.run(presets.service.auto_add()) == [], "what was added is not added twice"


def test_a_preset_added_by_hand_then_removed_is_declined_and_not_added_by_itself(presets: Presets) -> None:
    presets.join_cpu_node()
    name = "smollm2-135m-instruct"
    assert asyncio.run(presets.service.add(name, draft("POST /api/v1/presets/{name}"))) == name
    [record] = presets.store.list_presets()
    assert (record.name, record.added_by, record.declined) == (name, "ops@example", False)
    with pytest.raises(Conflict, match=f"name: model '{name}' is already in the catalog"):
        asyncio.run(presets.service.add(name, draft("POST /api/v1/presets/{name}")))
    with pytest.raises(NotFound, match="'no-such-preset' is not a preset"):
        asyncio.run(presets.service.add("no-such-preset", draft("POST /api/v1/presets/{name}")))

    asyncio.run(presets.writer.remove(name, draft("DELETE /api/v1/models/{name}")))
    asyncio.run(presets.service.set_auto(True, draft("PUT /api/v1/presets/auto")))
    shown = {p.name: p for p in asyncio.run(presets.service.view()).presets or []}
    assert shown[name].declined and "declined" in (shown[name].blocked or "") and not shown[name].in_catalog
    assert name not in presets.models.ids()


def test_what_fits_follows_each_report_of_a_nodes_cards(presets: Presets) -> None:
    presets.join_cpu_node(ram_gb=4)
    node = presets.fleet.get("n1")
    assert node is not None

    def cards(*cards: tuple[int, bool]) -> None:
        gpus = [
            nodeapi.InventoryGPU(index=i, name="GPU", **{"class": "X1"}, memory_mb=mb, healthy=healthy)
            for i, (mb, healthy) in enumerate(cards)
        ]
        assert node is not None
        apply_report(node.inventory, nodeapi.InventoryReport(gpus=gpus), None)

    def fitting() -> dict[str, list[str]]:
        return {p.name: p.fits_classes for p in asyncio.run(presets.service.view()).presets or [] if p.fits}

    cards((24_000, True))
    assert fitting()["llama-3.1-8b"] == ["X1"] and "llama-4-scout" not in fitting()
    cards((24_000, True), (81_500, True))
    assert fitting()["llama-4-scout"] == ["X1"], "a card reported since is counted on the next view"
    cards((24_000, True), (81_500, False))
    assert "llama-4-scout" not in fitting(), "an unhealthy card fits nothing"
    node.last_heartbeat = 0.0
    assert fitting() == {}, "a node that is not live offers nothing"
