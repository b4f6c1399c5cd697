"""Usage rows, one per ``/v1`` request: the rows behind ``/admin/v1/usage/stream``.

Counts and timings only, never content. Ids come from the store (BIGSERIAL / SQLite
AUTOINCREMENT) and are never handed out twice, even after retention deletes rows, so a cursor
stays valid across leader restarts. ``route_json`` is opod's own column (which worker, why) and
is not part of the contract's ``UsageData``. The table is registered on ``schema.metadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Row,
    Table,
    Text,
    UniqueConstraint,
    select,
)

from opod.store.base import Repository, aware, json_arg, text_arg
from opod.store.bulk import LedgerAppender
from opod.store.errors import InvalidInput
from opod.store.events import (
    CURSOR_ID,
    DELETE_BATCH,
    NewEvent,
    count_arg,
    delete_before,
    event_values,
    insert_new,
    page_args,
    serialize_appends,
)
from opod.store.events import events as events_table
from opod.store.schema import UTCDateTime, metadata

usage = Table(
    "usage",
    metadata,
    Column("id", CURSOR_ID, primary_key=True, autoincrement=True),
    Column("entry", Text, nullable=False),  # the ledger's own key: replaying its journal inserts nothing twice
    Column("request_id", Text, nullable=False),  # the X-Request-Id answered; a client may reuse one, so not unique
    Column("ts", UTCDateTime, nullable=False),
    Column("api_key_id", Text, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("protocol", Text, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("latency_ms", BigInteger, nullable=False),
    Column("ttft_ms", BigInteger, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("node_id", Text, nullable=False),
    Column("route_json", Text, nullable=True),
    UniqueConstraint("entry"),
    Index("ix_usage_ts", "ts"),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True, slots=True)
class NewUsage:
    """A usage row to append; the store gives it its id."""

    entry: str
    request_id: str
    ts: datetime
    api_key_id: str
    user_id: str
    model: str
    protocol: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    ttft_ms: int
    outcome: str
    node_id: str
    route_json: str | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    id: int
    entry: str
    request_id: str
    ts: datetime
    api_key_id: str
    user_id: str
    model: str
    protocol: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    ttft_ms: int
    outcome: str
    node_id: str
    route_json: str | None


_TEXT = ("request_id", "api_key_id", "user_id", "model", "protocol", "node_id")
_COUNTS = ("prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms")


def usage_values(row: NewUsage) -> dict[str, Any]:
    if not isinstance(row, NewUsage):
        raise InvalidInput(f"a usage row to append must be a NewUsage, not {type(row).__name__}")
    values: dict[str, Any] = {
        "entry": text_arg(row.entry, "usage entry"),
        "ts": aware(row.ts, "usage ts"),
        "outcome": text_arg(row.outcome, f"outcome of usage entry {row.entry!r}"),
        "route_json": None if row.route_json is None else json_arg(row.route_json, f"route_json of usage entry {row.entry!r}"),
    }
    for name in _TEXT:
        values[name] = text_arg(getattr(row, name), name, empty=True)
    for name in _COUNTS:
        values[name] = count_arg(getattr(row, name), name)
    return values


def _record(row: Row[Any]) -> UsageRecord:
    return UsageRecord(**row._mapping)


class UsageRepo(Repository):
    _appender: LedgerAppender | None = None

    def append_ledger(self, rows: Sequence[NewUsage], events: Sequence[NewEvent] = (), *, check_known: bool = True) -> tuple[int, int]:
        """Append usage rows and events in ONE transaction: all of them are stored, or none.

        A row or event whose ``entry`` is already stored is skipped, so appending the same batch
        twice (a journal replayed after a crash) stores it once. Every row is checked first; a
        bad one raises InvalidInput naming the field, and nothing is written. Returns how many
        usage rows and events were new.
        """
        return self._append_ledger([usage_values(row) for row in rows], [event_values(row) for row in events], check_known)

    def append_ledger_trusted(self, rows: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]] = ()) -> tuple[int, int]:
        """:meth:`append_ledger` for column values their producer has already made valid.

        For the ledger's live writer only, whose records are cleaned as they are built
        (``opod.ledger.records.live_values``): nothing is checked or parsed here, known entries
        are not looked up (ON CONFLICT still skips them; the counts returned include them), and
        the rows go through the driver's cursor (``opod.store.bulk``). A
        value the database itself refuses (a constraint) raises InvalidInput, and nothing of the
        batch is written: the caller then takes :meth:`append_ledger`, which names the field.
        """
        engine = self.engine  # StoreError once the store is closed
        if self._appender is None:
            self._appender = LedgerAppender(engine, usage, events_table)
        self._appender.append(rows, events)
        return len(rows), len(events)

    def _append_ledger(self, rows: list[dict[str, Any]], events: list[dict[str, Any]], check_known: bool) -> tuple[int, int]:
        with self._write() as conn:
            serialize_appends(conn)
            return (insert_new(conn, usage, rows, check_known=check_known),
                    insert_new(conn, events_table, events, check_known=check_known))

    def usage_after(self, after: int, limit: int) -> list[UsageRecord]:
        """Up to ``limit`` usage rows with an id above ``after``, by id."""
        after, limit = page_args(after, limit)
        query = select(usage).where(usage.c.id > after).order_by(usage.c.id).limit(limit)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def delete_usage_before(self, cutoff: datetime, *, limit: int = DELETE_BATCH) -> int:
        """Delete up to ``limit`` usage rows older than ``cutoff``; returns how many went."""
        cutoff = aware(cutoff, "cutoff")
        limit = count_arg(limit, "limit")
        with self._write() as conn:
            return delete_before(conn, usage, cutoff, limit)
