"""Settings versions on SQLite and PostgreSQL: each write is a new version on the newest base, never a lost update."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from opod.store import AuditRow, NotFound, Store
from opod.store.errors import InvalidInput
from opod.store.settings import StaleBase


def audit_row(target: str = "settings") -> AuditRow:
    return AuditRow(actor="alice", source="api", action="PUT /api/v1/settings", target=target, detail="{}", status=200)


def test_versions_are_numbered_from_one_and_read_back(store: Store) -> None:
    assert store.settings_newest() == 0
    assert store.settings_version() is None
    first = store.put_settings(0, "prices: {}\n", note="first", by="alice")
    second = store.put_settings(1, "budgets: []\n", note="", by="bob")
    assert (first.version, second.version) == (1, 2)
    assert store.settings_newest() == 2
    newest = store.settings_version()
    assert newest is not None and (newest.version, newest.body, newest.by) == (2, "budgets: []\n", "bob")
    old = store.settings_version(1)
    assert old is not None and (old.body, old.note, old.by) == ("prices: {}\n", "first", "alice")
    assert old.at.tzinfo is not None
    with pytest.raises(NotFound, match="settings version 9 does not exist"):
        store.settings_version(9)


def test_history_is_newest_first_and_limited(store: Store) -> None:
    for base in range(5):
        store.put_settings(base, f"# v{base + 1}\n", by="alice")
    assert [r.version for r in store.settings_history()] == [5, 4, 3, 2, 1]
    assert [r.version for r in store.settings_history(limit=2)] == [5, 4]
    with pytest.raises(InvalidInput, match="limit 0"):
        store.settings_history(limit=0)


def test_a_stale_base_is_refused_naming_the_newest_and_writes_nothing(store: Store) -> None:
    store.put_settings(0, "a: 1\n", by="alice", audit=audit_row())
    store.put_settings(1, "a: 2\n", by="alice", audit=audit_row())
    with pytest.raises(StaleBase, match="version 2 is") as refused:
        store.put_settings(1, "a: 3\n", by="bob", audit=audit_row("stale"))
    assert refused.value.newest == 2
    with pytest.raises(StaleBase):
        store.put_settings(0, "a: 3\n", by="bob")
    assert store.settings_newest() == 2
    assert [r.target for r in store.list_audit()] == ["settings", "settings"]  # the refused write left no audit row


def test_the_audit_row_commits_with_the_version(store: Store) -> None:
    store.put_settings(0, "a: 1\n", by="alice", audit=audit_row("settings:v1"))
    assert [(r.actor, r.target) for r in store.list_audit()] == [("alice", "settings:v1")]


def test_bad_arguments_are_refused_before_the_database(store: Store) -> None:
    with pytest.raises(InvalidInput, match="base"):
        store.put_settings(-1, "", by="alice")
    with pytest.raises(InvalidInput, match="NUL"):
        store.put_settings(0, "a\x00", by="alice")
    with pytest.raises(InvalidInput, match="by"):
        store.put_settings(0, "", by="")
    assert store.settings_newest() == 0


def test_two_writers_on_one_base_one_wins(open_store: Callable[[], Store]) -> None:
    stores = [open_store() for _ in range(2)]
    stores[0].put_settings(0, "a: 0\n", by="setup")
    start = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        start.wait()
        try:
            stores[n % 2].put_settings(1, f"a: {n}\n", by=f"writer{n}", audit=audit_row(f"w{n}"))
            result = f"won:{n}"
        except StaleBase as err:
            assert err.newest == 2
            result = "stale"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("stale") == 7
    newest = stores[0].settings_version()
    assert newest is not None and newest.version == 2 and newest.by == "writer" + winners[0].split(":")[1]
    assert [r.target for r in stores[1].list_audit()] == ["w" + winners[0].split(":")[1]]


def test_a_version_beyond_64_bits_is_refused_not_a_database_error(store: Store) -> None:
    with pytest.raises(InvalidInput, match="version"):
        store.settings_version(2**63)
    with pytest.raises(InvalidInput, match="base"):
        store.put_settings(2**63 - 1, "", by="alice")
