"""The live ledger's appends through the driver's cursor (``opod.store.bulk``): stored exactly as the
checked path stores them, all or nothing, and a database fault named, on both databases."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from opod.store import InvalidInput, Store, StoreError
from opod.store.engine import reason
from opod.store.events import event_values
from opod.store.usage import usage_values
from tests.store.test_usage_events import event, usage


def _without_ids(record: object) -> dict:
    return {k: v for k, v in asdict(record).items() if k not in ("id", "entry", "request_id")}  # type: ignore[call-overload]


@pytest.mark.parametrize("route", ['{"worker": "n1", "blocks": "3/4"}', None])
def test_a_row_reads_back_the_same_through_the_driver_as_through_the_checked_path(store: Store, route: str | None) -> None:
    # Microseconds, another zone, a null route and text beyond ASCII: what the column types convert.
    ts = datetime(2026, 3, 1, 23, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=2)))
    store.append_ledger([usage("checked", ts=ts, route_json=route, model="modèle-✓")], [event("e-checked", ts=ts)])
    store.append_ledger_trusted([usage_values(usage("trusted", ts=ts, route_json=route, model="modèle-✓"))],
                                [event_values(event("e-trusted", ts=ts))])
    checked, trusted = store.usage_after(0, 10)
    assert _without_ids(checked) == _without_ids(trusted)
    assert trusted.ts == ts and trusted.ts.utcoffset() == timedelta(0) and trusted.route_json == route
    checked_event, trusted_event = store.events_after(0, 10)
    assert _without_ids(checked_event) == _without_ids(trusted_event)


def test_a_refused_batch_leaves_the_connection_usable(store: Store) -> None:
    for _ in range(3):  # more refusals than the pool has idle connections
        with pytest.raises(InvalidInput, match="the database refused a ledger batch"):
            store.append_ledger_trusted([usage_values(usage("ok")), {**usage_values(usage("bad")), "request_id": None}])
    assert store.append_ledger_trusted([usage_values(usage("after"))]) == (1, 0)
    assert [r.entry for r in store.usage_after(0, 10)] == ["after"]


def test_a_database_that_cannot_take_the_rows_is_named_and_keeps_nothing(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE events RENAME TO events_elsewhere"))
    with pytest.raises(StoreError, match=r"store at .*events") as raised:
        store.append_ledger_trusted([usage_values(usage("lost"))], [event_values(event("e"))])
    assert not isinstance(raised.value, InvalidInput)  # the writer retries it; it does not set the rows aside
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE events_elsewhere RENAME TO events"))
    assert store.usage_after(0, 10) == []  # the usage rows of the failed batch were rolled back with it
    assert store.append_ledger_trusted([usage_values(usage("lost"))], [event_values(event("e"))]) == (1, 1)


def test_a_driver_error_without_a_message_is_named_by_its_kind() -> None:
    # The driver path hands reason() the driver's own error, which has no SQLAlchemy ``orig``.
    assert reason(sqlite3.OperationalError()) == "OperationalError"
    assert reason(sqlite3.OperationalError("disk I/O error\nmore")) == "disk I/O error"
