"""The ledger's tables are appended to through the driver's cursor (``opod.store.bulk``): a row
reads back exactly as given, a batch is stored whole or not at all, and a database fault is named,
on both databases."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import sqlite

from opod.store import InvalidInput, Store, StoreError
from opod.store.bulk import bind_processor
from opod.store.engine import reason
from opod.store.schema import request_bodies
from opod.store.usage import usage_values
from tests.store.test_usage_events import event
from tests.store.test_usage_events import usage as usage_row


@pytest.mark.parametrize("route", ['{"worker": "n1", "blocks": "3/4"}', None])
def test_a_row_reads_back_exactly_as_it_was_given(store: Store, route: str | None) -> None:
    # Microseconds, another zone, a null route and text beyond ASCII: what the column types convert.
    ts = datetime(2026, 3, 1, 23, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=2)))
    given = usage_row("r", ts=ts, route_json=route, model="modèle-✓", prompt_tokens=2**63 - 1)
    assert store.append_ledger([given], [event("e", ts=ts, subject="nœud")]) == (1, 1)
    [row] = store.usage_after(0, 10)
    assert (row.ts, row.ts.utcoffset(), row.route_json, row.model, row.prompt_tokens) == (
        ts,
        timedelta(0),
        route,
        "modèle-✓",
        2**63 - 1,
    )
    assert (row.entry, row.request_id, row.outcome, row.ttft_ms) == (
        given.entry,
        given.request_id,
        given.outcome,
        given.ttft_ms,
    )
    [stored_event] = store.events_after(0, 10)
    assert (stored_event.ts, stored_event.subject, stored_event.data_json) == (ts, "nœud", '{"hostname": "h"}')


def test_a_batch_the_database_refuses_stores_nothing_and_leaves_the_connection_usable(store: Store) -> None:
    appender = store._ledger_appender()
    for _ in range(3):  # more refusals than the pool has idle connections
        with pytest.raises(InvalidInput, match="the database refused a ledger batch"):
            appender.append(
                [usage_values(usage_row("ok")), {**usage_values(usage_row("bad")), "request_id": None}],
                [],
                skip_known=False,
            )
    assert store.append_ledger([usage_row("after")]) == (1, 0)
    assert [r.entry for r in store.usage_after(0, 10)] == ["after"]


def test_a_database_that_cannot_take_the_rows_is_named_and_keeps_nothing(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE events RENAME TO events_elsewhere"))
    with pytest.raises(StoreError, match=r"store at .*events") as raised:
        store.append_ledger([usage_row("lost")], [event("e")], check_known=False)
    assert not isinstance(raised.value, InvalidInput)  # the writer retries it; it does not set the rows aside
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE events_elsewhere RENAME TO events"))
    assert store.usage_after(0, 10) == []  # the usage rows of the failed batch were rolled back with it
    assert store.append_ledger([usage_row("lost")], [event("e")]) == (1, 1)


def test_known_entries_are_looked_up_in_chunks_the_database_accepts(store: Store) -> None:
    batch = [usage_row(f"u{i}") for i in range(1200)]  # more entries than one look-up asks for
    assert store.append_ledger(batch[:700]) == (700, 0)
    assert store.append_ledger(batch) == (500, 0)
    assert [r.id for r in store.usage_after(1195, 10)] == [1196, 1197, 1198, 1199, 1200]  # the replay consumed no ids


def test_a_driver_error_without_a_message_is_named_by_its_kind() -> None:
    # The driver path hands reason() the driver's own error, which has no SQLAlchemy ``orig``.
    assert reason(sqlite3.OperationalError()) == "OperationalError"
    assert reason(sqlite3.OperationalError("disk I/O error\nmore")) == "disk I/O error"


def test_a_utc_time_on_sqlite_is_written_as_sqlalchemy_writes_it() -> None:
    dialect = sqlite.dialect()
    ours = bind_processor(request_bodies.c.at, dialect)
    theirs = request_bodies.c.at.type.dialect_impl(dialect).bind_processor(dialect)
    assert ours is not None and theirs is not None and ours is not theirs
    for value in (
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2026, 3, 1, 4, 5, 6, tzinfo=UTC),  # no microseconds: written all the same
        datetime.now(UTC),
        datetime(2026, 3, 1, tzinfo=timezone(timedelta(hours=-5))),  # converted to UTC first
        datetime(2026, 3, 1, tzinfo=ZoneInfo("Europe/Paris")),
    ):
        assert ours(value) == theirs(value)
    with pytest.raises(ValueError, match="naive"):
        ours(datetime(2026, 3, 1))
