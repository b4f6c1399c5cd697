"""Following the store: what one leader changes reaches another leader's memory, and a read never undoes a change made here.

Two leaders are two sets of in-memory objects over one store file, each with its own ``Store``.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opod.access.keytable import KeyEntry, KeyTable
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy, TenancyScopes
from opod.fleet.quotas import Amount, Bounds, Quota, QuotaTable
from opod.fleet.quotas_service import QuotasService, load_quotas
from opod.http.errors import Unauthorized
from opod.security.keys import hash_key
from opod.security.nodetokens import NodeTokenMinter
from opod.store import QuotaAmounts, Store
from opod.store.following import StaleRead

SECRET = secrets.token_bytes(32)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    url = f"sqlite:///{tmp_path / 'opod.db'}"
    with Store.open(url) as first, Store.open(url) as second:
        yield first, second


async def test_keys_minted_and_revoked_on_one_leader_are_accepted_and_refused_on_the_other(
    stores: tuple[Store, Store],
) -> None:
    a = AccessService.load(stores[0], NodeTokenMinter(SECRET))
    b = AccessService.load(stores[1], NodeTokenMinter(SECRET))
    record, secret = await a.create("api", "ci")
    with pytest.raises(Unauthorized, match="not known"):
        b.keys.check(f"Bearer {secret}")
    assert await b.follow() == 1
    assert b.keys.check(f"Bearer {secret}").id == record.id
    assert await b.follow() == 0  # read again within the overlap: nothing changes
    token, _ = await a.create("node", "rack 7")
    await a.revoke(record.id)
    assert await b.follow() == 2
    with pytest.raises(Unauthorized, match="revoked"):
        b.keys.check(f"Bearer {secret}")
    assert b.tokens.token_for_node("n1") is None
    b.bind_node("n1", token.id)
    assert b.tokens.token_for_node("n1") is not None  # the node token minted on A is known on B
    await a.revoke(token.id)
    await b.follow()
    assert b.tokens.token_for_node("n1") is None


async def test_a_key_created_long_ago_by_the_clock_is_still_read_within_the_overlap(
    stores: tuple[Store, Store],
) -> None:
    a = AccessService.load(stores[0], NodeTokenMinter(SECRET))
    b = AccessService.load(stores[1], NodeTokenMinter(SECRET))
    await a.create("api", "first")
    await b.follow()
    # A writer whose clock is a minute behind: its key's time is before the newest change B has seen.
    late = stores[0].create_key(
        kind="api",
        name="late",
        hash=hash_key("sk-late"),
        prefix="sk-l",
        created_at=datetime.now(UTC) - timedelta(minutes=1),
    )
    assert await b.follow() == 1
    assert b.keys.check("Bearer sk-late").id == late.id


def test_a_read_that_overlapped_a_revocation_here_does_not_lift_it() -> None:
    table = KeyTable()
    entry = KeyEntry("k_1", "api", "ci", hash_key("sk-1"))
    table.put(entry)
    table.revoke("k_1")
    assert table.follow([entry]) == 0  # the store's row as read before the revocation committed
    with pytest.raises(Unauthorized, match="revoked"):
        table.check("Bearer sk-1")


async def test_the_tree_changed_on_one_leader_is_in_force_on_the_other(stores: tuple[Store, Store]) -> None:
    a, b = Tenancy.load(stores[0]), Tenancy.load(stores[1])
    await a.create("org", "acme", None)
    await a.create("team", "ml", "acme")
    chat = await a.create("project", "chat", "acme/ml")
    assert b.chain(chat.id) is None
    assert await b.follow() is True
    assert b.resolve("project:acme/ml/chat").id == chat.id and b.path(chat.id) == "acme/ml/chat"
    assert await b.follow() is False
    await a.change("project", chat.id, name="talk", parent=None)
    await b.follow()
    assert b.path(chat.id) == "acme/ml/talk"
    await a.delete("project", chat.id)
    await b.follow()
    assert b.chain(chat.id) is None


async def test_a_tree_read_that_overlapped_a_change_here_is_not_applied(stores: tuple[Store, Store]) -> None:
    started, released = threading.Event(), threading.Event()

    class SlowRead:
        """The store, whose read of the tree is held until the change below has been made here."""

        def __getattr__(self, name: str) -> object:
            return getattr(stores[1], name)

        def tenancy_tree(self) -> object:
            tree = stores[1].tenancy_tree()
            started.set()
            released.wait(5)
            return tree

    b = Tenancy(SlowRead(), stores[1].tenancy_tree())  # type: ignore[arg-type]
    reading = asyncio.ensure_future(b.follow())
    assert await asyncio.to_thread(started.wait, 5)  # the read has been made
    await b.create("org", "beta", None)
    released.set()
    with pytest.raises(StaleRead):  # the read, older than the change, is dropped
        await reading
    assert b.resolve("org:beta")
    assert await b.follow() is False  # the next read holds the change
    assert b.resolve("org:beta")


class Kicks(list[int]):
    """The reconciler as the quotas see it: each round asked for is a 1."""

    def kick(self) -> None:
        self.append(1)

    def quota_holds(self) -> dict[str, Amount]:
        return {}


def quota_follower(store: Store, table: QuotaTable, kicks: Kicks) -> QuotasService:
    return QuotasService(store, table, scopes=TenancyScopes(Tenancy.load(store)), reconciler=kicks)


async def test_quotas_put_or_removed_on_one_leader_reach_the_others_table(stores: tuple[Store, Store]) -> None:
    table = load_quotas(stores[1])
    kicks = Kicks()
    follower = quota_follower(stores[1], table, kicks)
    stores[0].put_quota("team:t1", "team", QuotaAmounts(), QuotaAmounts(gpus=2), by="alice")
    assert await follower.follow() is True
    assert table.get("team:t1") == Quota("team:t1", Bounds(), Bounds(gpus=2)) and kicks == [1]
    assert await follower.follow() is False and kicks == [1]
    stores[0].remove_quota("team:t1")
    assert await follower.follow() is True
    assert table.all() == [] and kicks == [1, 1]


async def test_a_quota_read_that_overlapped_a_change_here_is_not_applied(stores: tuple[Store, Store]) -> None:
    table = load_quotas(stores[1])
    mine = Quota("team:t2", Bounds(), Bounds(gpus=1))

    class ChangedDuringTheRead:
        def list_quotas(self) -> list:
            """The store's read, with this leader's change landing meanwhile."""
            rows = stores[1].list_quotas()
            table.put(mine)
            return rows

    follower = QuotasService(
        ChangedDuringTheRead(),  # type: ignore[arg-type]
        table,
        scopes=TenancyScopes(Tenancy.load(stores[1])),
        reconciler=Kicks(),
    )
    with pytest.raises(StaleRead):
        await follower.follow()
    assert table.get("team:t2") == mine
