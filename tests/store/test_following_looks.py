"""The one owner of following the store, on SQLite and PostgreSQL: its followers read only after a commit.

A change another handle (another leader) commits is read at the next look; a store nobody wrote to is not read
at all (no follower called, no statement sent but the mark's); a follower that failed or dropped a stale read
is run again, the others are not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

import pytest

from opod.access.tenancy import Tenancy
from opod.settings.holder import SettingsHolder
from opod.store import Store, StoreError
from opod.store.following import Following, StaleRead
from opod.store.offloop import run_sync
from tests.store.conftest import Statements, first_read, quietly

BODY = "retention: {bodies_days: 2}\n"


class Counted:
    """A follower as the leader registers one, counting its calls; ``trouble`` makes each call fail or drop its read."""

    def __init__(self, read: Callable[[], object] | None = None, trouble: type[Exception] | None = None) -> None:
        self.calls = 0
        self.read = read
        self.trouble = trouble

    async def __call__(self) -> object:
        self.calls += 1
        if self.trouble is not None:
            raise self.trouble("as told")
        return await self.read() if self.read is not None else None  # type: ignore[misc]


def not_marks(statements: list[str]) -> list[str]:
    return [s for s in statements if "pg_current_snapshot" not in s]


async def test_the_first_look_reads_and_a_store_nobody_wrote_to_is_not_read_again(
    open_store: Callable[[], Store],
) -> None:
    store = open_store()
    holder, tenancy = SettingsHolder(store), Tenancy.load(store)
    settings, tree = Counted(holder.follow), Counted(tenancy.follow)
    following = Following(store)
    following.add("the settings", settings)
    following.add("the tenancy tree", tree)
    assert await following.look() == ["the settings", "the tenancy tree"]
    assert (settings.calls, tree.calls) == (1, 1)

    statements = Statements(store)
    try:
        assert await quietly(store, following.look) == []
        assert await quietly(store, following.look) == []
    finally:
        statements.stop()
    assert (settings.calls, tree.calls) == (1, 1)
    assert not_marks(statements) == []


async def test_a_change_made_on_another_handle_is_read_at_the_next_look(open_store: Callable[[], Store]) -> None:
    ours, theirs = open_store(), open_store()
    holder, tenancy = SettingsHolder(ours), Tenancy.load(ours)
    holder.load()
    following = Following(ours)
    following.add("the settings", holder.follow)
    following.add("the tenancy tree", tenancy.follow)
    await following.look()
    await run_sync(theirs.put_settings, 0, BODY, by="another leader")
    await run_sync(theirs.create_org, "acme")
    assert await first_read(following) == ["the settings", "the tenancy tree"]
    assert (holder.version, holder.current.retention.bodies_days) == (1, 2)
    assert tenancy.resolve("org:acme")


async def test_a_change_committed_during_a_read_is_read_again_at_the_next_look(
    open_store: Callable[[], Store],
) -> None:
    ours, theirs = open_store(), open_store()
    holder = SettingsHolder(ours)

    async def read_then_another_leader_writes() -> bool:
        changed = await holder.follow()
        if holder.version == 0:  # the read is made; the other leader's version lands after it
            await run_sync(theirs.put_settings, 0, BODY, by="another leader")
        return changed

    following = Following(ours)
    following.add("the settings", read_then_another_leader_writes)
    await following.look()
    assert holder.version == 0
    assert await first_read(following) == ["the settings"]
    assert holder.version == 1


async def test_a_follower_that_failed_or_dropped_a_stale_read_is_run_again_and_only_it(
    open_store: Callable[[], Store],
) -> None:
    store = open_store()
    fine, failing, stale = Counted(), Counted(trouble=StoreError), Counted(trouble=StaleRead)
    following = Following(store)
    for what, follower in (("fine", fine), ("failing", failing), ("stale", stale)):
        following.add(what, follower)
    assert await following.look() == ["fine", "failing", "stale"]
    assert await quietly(store, following.look) == ["failing", "stale"]
    failing.trouble = stale.trouble = None
    await following.look()
    assert await quietly(store, following.look) == []
    runs = fine.calls
    await run_sync(store.create_org, "acme")
    assert await first_read(following) == ["fine", "failing", "stale"] and fine.calls == runs + 1


class MarkAwayOnce:
    """The store, whose first commit mark cannot be read (the database restarting)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.asked = 0

    def commit_mark(self) -> Hashable:
        self.asked += 1
        if self.asked == 1:
            raise StoreError("the store is away")
        return self.store.commit_mark()


async def test_the_loop_goes_on_after_a_failed_look_and_stops_when_asked(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    stop, reads = asyncio.Event(), []

    async def follower() -> None:
        reads.append(1)
        if len(reads) == 1:
            raise StoreError("a read failed")
        stop.set()

    marks = MarkAwayOnce(store)
    following = Following(marks, every=0.01)
    following.add("things", follower)
    await asyncio.wait_for(following.run(stop), 10)
    assert len(reads) == 2 and marks.asked == 3
    assert "cannot tell whether the store changed" in caplog.text and "cannot read things" in caplog.text
