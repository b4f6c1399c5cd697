"""Lifecycle events (node registered, model loaded, …): the rows behind ``/admin/v1/events/stream``.

The table lives here rather than in ``schema.py`` because it belongs to the ledger's cursor
streams; it is registered on the same ``metadata``, so the schema test and Alembic see it.
The cursor helpers shared with the usage table (the id type, the writers' lock, the page and
retention checks) are here too, because ``usage.py`` builds on this module. Both tables are
appended to by ``UsageRepo.append_ledger`` and ``append_checked`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Index,
    Insert,
    Integer,
    Row,
    Table,
    Text,
    UniqueConstraint,
    delete,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from opod.http import fastjson
from opod.store.base import Repository, aware, text_arg
from opod.store.errors import InvalidInput
from opod.store.schema import UTCDateTime, metadata

INT64_MAX = 2**63 - 1
PAGE_MAX = 10_000  # rows one read may ask for; the streams ask for at most 1001
DELETE_BATCH = 5_000  # rows one retention transaction deletes, so writers never wait long

# A 64-bit id on PostgreSQL (BIGSERIAL). On SQLite only "INTEGER PRIMARY KEY" is the rowid, and
# AUTOINCREMENT (sqlite_autoincrement on the table) keeps an id from being handed out twice even
# after retention deletes the newest rows; SQLite integers are 64-bit anyway.
CURSOR_ID = BigInteger().with_variant(Integer(), "sqlite")

# Every append on PostgreSQL takes this transaction-scoped lock first (id: the bytes of "opodldgr"),
# so appends commit in id order and a cursor never skips a row committed late: two writers (two
# leaders on one PostgreSQL) could otherwise take ids 7 and 8, commit 8 first, and a reader that
# saw 8 would pass over 7 for good. SQLite's BEGIN IMMEDIATE already serializes writers.
APPEND_LOCK_ID = int.from_bytes(b"opodldgr", "big") & 0x7FFF_FFFF_FFFF_FFFF
APPEND_LOCK = text("SELECT pg_advisory_xact_lock(:id)")

events = Table(
    "events",
    metadata,
    Column("id", CURSOR_ID, primary_key=True, autoincrement=True),
    Column("entry", Text, nullable=False),  # the ledger's own key: replaying its journal inserts nothing twice
    Column("ts", UTCDateTime, nullable=False),
    Column("type", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("data_json", Text, nullable=False),
    UniqueConstraint("entry"),
    Index("ix_events_ts", "ts"),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append; the store gives it its id."""

    entry: str
    ts: datetime
    type: str
    subject: str
    data_json: str  # a JSON object


@dataclass(frozen=True, slots=True)
class EventRecord:
    id: int
    entry: str
    ts: datetime
    type: str
    subject: str
    data_json: str


def insert_ignoring_known(dialect: Dialect, table: Table) -> Insert:
    """INSERT that skips a row whose ``entry`` is already stored: replaying a journal is safe."""
    if dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=["entry"])
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=["entry"])


def count_arg(value: int, field: str) -> int:
    """A count, duration or id: an int from 0 to 2^63-1 (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field} must be a whole number, not {type(value).__name__}")
    if not 0 <= value <= INT64_MAX:
        raise InvalidInput(f"{field} is {value}; it must be from 0 to {INT64_MAX}")
    return value


def page_args(after: int, limit: int) -> tuple[int, int]:
    after = count_arg(after, "after")
    limit = count_arg(limit, "limit")
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidInput(f"limit is {limit}; ask for 1 to {PAGE_MAX} rows at a time")
    return after, limit


def object_json_arg(value: str, field: str) -> str:
    """JSON text holding an object, kept exactly as given."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be JSON text (str), not {type(value).__name__}")
    try:
        parsed = fastjson.loads(value)
    except ValueError as err:
        raise InvalidInput(f"{field} is not valid JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"{field} must be a JSON object ({{...}}), not {type(parsed).__name__}")
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character, which PostgreSQL text cannot hold")
    return value


def event_values(row: NewEvent) -> dict[str, Any]:
    if not isinstance(row, NewEvent):
        raise InvalidInput(f"an event to append must be a NewEvent, not {type(row).__name__}")
    return {
        "entry": text_arg(row.entry, "event entry"),
        "ts": aware(row.ts, "event ts"),
        "type": text_arg(row.type, "event type"),
        "subject": text_arg(row.subject, "event subject", empty=True),
        "data_json": object_json_arg(row.data_json, f"data_json of event {row.type!r}"),
    }


def delete_before(conn: Connection, table: Table, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` rows older than ``cutoff``, oldest ids first."""
    oldest = select(table.c.id).where(table.c.ts < cutoff).order_by(table.c.id).limit(limit)
    return conn.execute(delete(table).where(table.c.id.in_(oldest.scalar_subquery()))).rowcount


def _record(row: Row[Any]) -> EventRecord:
    return EventRecord(**row._mapping)


class EventsRepo(Repository):
    def events_after(self, after: int, limit: int) -> list[EventRecord]:
        """Up to ``limit`` events with an id above ``after``, by id."""
        after, limit = page_args(after, limit)
        query = select(events).where(events.c.id > after).order_by(events.c.id).limit(limit)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def delete_events_before(self, cutoff: datetime, *, limit: int = DELETE_BATCH) -> int:
        """Delete up to ``limit`` events older than ``cutoff``; returns how many went."""
        cutoff = aware(cutoff, "cutoff")
        limit = count_arg(limit, "limit")
        with self._write() as conn:
            return delete_before(conn, events, cutoff, limit)
