"""The tenancy tree in memory: what the gateway and every area read, changed right after the store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.scopes import Scope
from opod.access.tenancy import ProjectChain, Tenancy
from opod.store import Conflict, InvalidInput, NotFound, Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'opod.db'}") as opened:
        yield opened


def test_chain_path_name_and_ancestors_follow_each_change(store: Store) -> None:
    tenancy = Tenancy.load(store)

    async def build() -> tuple[str, str, str, str]:
        acme = await tenancy.create("org", "acme", None)
        beta = await tenancy.create("org", "beta", None)
        ml = await tenancy.create("team", "ml", "acme")
        chat = await tenancy.create("project", "chat", "acme/ml")
        return acme.id, beta.id, ml.id, chat.id

    acme, beta, ml, chat = asyncio.run(build())
    assert tenancy.chain(chat) == ProjectChain(chat, ml, acme) and tenancy.chain("prj_unknown") is None
    assert tenancy.path(chat) == "acme/ml/chat" and tenancy.name(Scope("team", ml)) == "acme / ml"
    assert tenancy.ancestors(Scope("project", chat)) == [Scope("project", chat), Scope("team", ml), Scope("org", acme)]
    assert tenancy.resolve("project:acme/ml/chat") == tenancy.resolve(chat) == Scope("project", chat)
    assert tenancy.resolve("acme/ml", kinds=("team",)) == Scope("team", ml)

    asyncio.run(tenancy.change("team", ml, name=None, parent="beta"))
    assert tenancy.chain(chat) == ProjectChain(chat, ml, beta) and tenancy.path(chat) == "beta/ml/chat"
    # A second reader built from the store sees the same tree: memory never ran ahead of it.
    again = Tenancy.load(store)
    assert again.path(chat) == "beta/ml/chat" and again.chain(chat) == tenancy.chain(chat)

    with pytest.raises(NotFound, match="organization 'beta' has no team 'nope'"):
        tenancy.resolve("team:beta/nope")
    with pytest.raises(InvalidInput, match="cycle"):
        asyncio.run(tenancy.change("project", chat, name=None, parent="beta/ml/chat"))
    with pytest.raises(Conflict):
        asyncio.run(tenancy.delete("org", "beta"))
    assert tenancy.path(chat) == "beta/ml/chat"
    asyncio.run(tenancy.delete("org", "acme"))
    assert [o.name for o in tenancy.orgs] == ["beta"]
    assert (
        tenancy.user("ada@example.com") is None
        and tenancy.user_active("usr_1")
        and tenancy.belongs("usr_1", chat) is None
    )
