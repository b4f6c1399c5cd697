"""The audit table on SQLite and PostgreSQL: a row written with a change rolls back with it, and the listing is
newest first with its filters."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from opod.store import AuditRow, Store
from opod.store.audit import insert_audit
from opod.store.errors import InvalidInput
from tests.store.conftest import at


def row(
    actor: str = "alice",
    action: str = "POST /api/v1/orgs",
    target: str = "org_1",
    seconds: float = 0,
    status: int = 201,
) -> AuditRow:
    return AuditRow(
        actor=actor, source="api", action=action, target=target, detail='{"name":"acme"}', status=status, at=at(seconds)
    )


def test_a_row_written_with_a_change_rolls_back_with_it(store: Store) -> None:
    with pytest.raises(RuntimeError), store._write() as conn:
        insert_audit(conn, row())
        raise RuntimeError("the change failed")
    assert store.list_audit() == []
    with store._write() as conn:
        insert_audit(conn, row())
        conn.execute(text("SELECT 1"))
    assert [r.action for r in store.list_audit()] == ["POST /api/v1/orgs"]


def test_the_listing_is_newest_first_and_filtered(store: Store) -> None:
    store.record_audit(row("alice", "POST /api/v1/orgs", "org_1", 0))
    store.record_audit(row("bob", "PATCH /api/v1/teams/{id}", "team_9", 10, 200))
    store.record_audit(row("alice", "DELETE /api/v1/keys/{id}", "k_100%_sure", 20, 404))
    assert [r.target for r in store.list_audit()] == ["k_100%_sure", "team_9", "org_1"]
    assert [r.target for r in store.list_audit(actor="alice")] == ["k_100%_sure", "org_1"]
    assert [r.target for r in store.list_audit(since=at(5))] == ["k_100%_sure", "team_9"]
    assert [r.target for r in store.list_audit(contains="teams")] == ["team_9"]
    assert [r.target for r in store.list_audit(contains="100%")] == ["k_100%_sure"]  # % is matched as itself
    assert [r.target for r in store.list_audit(contains="_9")] == ["team_9"]
    assert len(store.list_audit(limit=1)) == 1
    assert store.list_audit(actor="alice")[0].status == 404


def test_a_row_that_is_no_change_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInput, match="status"):
        store.record_audit(row(status=42))
    with pytest.raises(InvalidInput, match="actor"):
        store.record_audit(AuditRow(actor="", source="api", action="POST /x", target="", detail="", status=200))
