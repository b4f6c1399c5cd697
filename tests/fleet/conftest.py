"""A models' writer on a real SQLite store, with a small tenancy tree, for the services' tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from opod.access.tenancy import Tenancy, TenancyScopes
from opod.catalog import load_catalog
from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.store import Store
from opod.store.audit import SOURCE_API, AuditDraft, AuditRecord

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def sim_model(name: str, **fields: Any) -> CatalogModel:
    return CatalogModel(name=name, profiles=[CatalogProfile(engine="sim")], **fields)


def new_draft(action: str = "POST /api/v1/models") -> AuditDraft:
    return AuditDraft(actor="ops@example", source=SOURCE_API, action=action)


class Kicks:
    """The reconciler as the models' writer tells it: counts the rounds asked for."""

    def __init__(self) -> None:
        self.count = 0

    def kick(self) -> None:
        self.count += 1


@dataclass
class ModelsSetup:
    store: Store
    models: ModelRegistry
    fleet: Fleet
    kicks: Kicks
    service: ModelsService
    ids: dict[str, str]
    """``acme``, ``acme/ml``, ``acme/ml/chat`` → their IDs."""

    def audit(self) -> list[AuditRecord]:
        return self.store.list_audit(limit=100)

    def stored(self, name: str) -> dict[str, Any]:
        definition = self.store.get_model(name).definition_json
        assert definition is not None
        return dict(json.loads(definition))

    def placements(self, name: str) -> dict[str, str]:
        return {p.node_id: p.wanted for p in self.store.list_placements(name)}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[ModelsSetup]:
    """The writer, ``smollm2-135m-instruct`` declared by the leader's settings, and the tree acme / ml / chat."""
    with Store.open(None, home=tmp_path) as store:
        tenancy = Tenancy.load(store)

        async def tree() -> dict[str, str]:
            acme = await tenancy.create("org", "acme", None)
            ml = await tenancy.create("team", "ml", "acme")
            chat = await tenancy.create("project", "chat", "acme/ml")
            return {"acme": acme.id, "acme/ml": ml.id, "acme/ml/chat": chat.id}

        ids = run(tree())
        models, fleet, kicks = ModelRegistry(), Fleet(), Kicks()
        service = ModelsService(
            store,
            models,
            load_catalog(),
            fleet,
            kicks,
            TenancyScopes(tenancy),
            declared=frozenset({"smollm2-135m-instruct"}),
        )
        yield ModelsSetup(store, models, fleet, kicks, service, ids)
