"""Appending usage rows and events through the database driver's cursor, under one transaction.

The ledger's writer commits every few tens of milliseconds under load, and once per request when
idle, in a thread that holds the GIL the event loop waits for. Through SQLAlchemy's execution
machinery a commit costs clearly more CPU than on the driver's own cursor (measured side by side:
``bench/results/usage-write-paths.md``), so the ledger's tables are appended to here, and only here.

The statements are the store's own, compiled once per dialect: INSERT … ON CONFLICT (entry) DO
NOTHING with each column's bind processor (``UTCDateTime`` to the text SQLite keeps, for one), so
a row is stored exactly as SQLAlchemy would store it; the transaction starts the way the store's
write transactions do (``BEGIN_WRITE`` on SQLite, the append lock on PostgreSQL). A UTC time's text
on SQLite is written here without SQLAlchemy's processor, the same text for a fraction of its cost:
every row has one or two, and that processor builds a dictionary for each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import ClauseElement, Column, Engine, Table, bindparam, or_, update
from sqlalchemy.engine.interfaces import DBAPICursor, DBAPIModule, Dialect
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.compiler import SQLCompiler

from opod.store.base import upsert_rows
from opod.store.engine import BEGIN_WRITE, mask, reason
from opod.store.errors import InvalidInput, StoreError
from opod.store.events import APPEND_LOCK, APPEND_LOCK_ID, insert_ignoring_known
from opod.store.schema import UTCDateTime

KNOWN_CHUNK = 500  # entries one look-up asks for; below every SQLite build's limit on parameters

Parameters = tuple[Any, ...] | dict[str, Any]
Values = Mapping[str, Any]
"""A row's checked column values, by name."""
Ordered = Sequence[Any]
"""A row's checked column values, in the order of the names its statement was made with."""
BindProcessor = Callable[[Any], Any]

SQLITE_DATETIME = "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
"""The text SQLAlchemy keeps a datetime as on SQLite (its ``DATETIME``'s default storage format)."""


def bind_processor(column: Column[Any], dialect: Dialect) -> BindProcessor | None:
    """What ``column``'s values become for ``dialect``'s driver: SQLAlchemy's bind processor, or for a UTC time on
    SQLite one that writes the same text (:data:`SQLITE_DATETIME`) without building a dictionary for each value."""
    kept = column.type.dialect_impl(dialect)
    processor = kept.bind_processor(dialect)
    if processor is None or not isinstance(kept, UTCDateTime):
        return processor
    if getattr(kept.impl_instance, "_storage_format", None) != SQLITE_DATETIME:
        return processor
    general = processor

    def utc_text(value: Any) -> Any:
        if type(value) is datetime and value.tzinfo is UTC:
            # printf style: of the ways to write this text, the one that costs least.
            return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031
                value.year,
                value.month,
                value.day,
                value.hour,
                value.minute,
                value.second,
                value.microsecond,
            )
        return general(value)  # another zone, or a subclass: converted to UTC first, as SQLAlchemy does

    return utc_text


class Statement:
    """A store statement compiled once for the engine's dialect; its parameters in the driver's form."""

    def __init__(
        self,
        engine: Engine,
        clause: ClauseElement,
        names: Sequence[str],
        convert: Mapping[str, BindProcessor | None] | None = None,
        *,
        ordered: bool = False,
    ) -> None:
        """``ordered``: :meth:`many` is given rows as :data:`Ordered` values, not by name."""
        compiled = clause.compile(dialect=engine.dialect, column_keys=list(names))
        assert isinstance(compiled, SQLCompiler)  # a statement, not DDL
        self.sql = compiled.string
        # sqlite3 takes a tuple in the statement's order (qmark); psycopg a dict by name (pyformat).
        self.positional = compiled.positiontup is not None
        self.names = tuple(compiled.positiontup or names)
        self.convert = tuple((convert or {}).get(name) for name in self.names)
        keys: list[Any] = [list(names).index(name) for name in self.names] if ordered else list(self.names)
        self._values: Callable[[Any], Sequence[Any]]
        if keys == list(range(len(keys))):
            self._values = tuple  # rows in the statement's own order, taken as they are (a tuple is not copied)
        else:
            self._values = itemgetter(*keys) if len(keys) > 1 else lambda row: (row[keys[0]],)
        self._converted = tuple((i, convert) for i, convert in enumerate(self.convert) if convert is not None)

    def parameters(self, values: dict[str, Any]) -> Parameters:
        converted = [
            values[name] if convert is None else convert(values[name])
            for name, convert in zip(self.names, self.convert)
        ]
        return tuple(converted) if self.positional else dict(zip(self.names, converted))

    def many(self, rows: Sequence[Values] | Sequence[Ordered]) -> list[Sequence[Any]] | list[dict[str, Any]]:
        """:meth:`parameters` for each row, for ``executemany``: its values taken in one call, then the few columns
        with a bind processor converted."""
        values, converted = self._values, self._converted
        out: list[Sequence[Any]] = []
        for row in rows:
            got = values(row)
            if converted:
                got = list(got)
                for i, convert in converted:
                    got[i] = convert(got[i])
            out.append(got)
        if self.positional:
            return out
        return [dict(zip(self.names, got)) for got in out]


class _Table:
    """One ledger table's statements: the insert that skips known entries, and the look-up of them."""

    def __init__(self, engine: Engine, table: Table) -> None:
        dialect = engine.dialect
        convert = {c.name: bind_processor(c, dialect) for c in table.columns if not c.primary_key}
        self.insert = Statement(engine, insert_ignoring_known(dialect, table), list(convert), convert)
        self._name = dialect.identifier_preparer.format_table(table)
        self._mark = "?" if dialect.paramstyle == "qmark" else "%s"  # psycopg takes %s with a tuple too

    def unknown(self, cursor: DBAPICursor, rows: Sequence[Values]) -> Sequence[Values]:
        """The rows whose entry is not stored yet."""
        known: set[str] = set()
        entries = [row["entry"] for row in rows]
        for start in range(0, len(entries), KNOWN_CHUNK):
            chunk = entries[start : start + KNOWN_CHUNK]
            cursor.execute(
                f"SELECT entry FROM {self._name} WHERE entry IN ({', '.join([self._mark] * len(chunk))})", tuple(chunk)
            )
            known.update(entry for (entry,) in cursor.fetchall())
        return [row for row in rows if row["entry"] not in known] if known else rows

    def append(self, cursor: DBAPICursor, rows: Sequence[Values]) -> int:
        """Insert the rows; how many were new (the driver sums an executemany's changes)."""
        if not rows:
            return 0
        cursor.executemany(self.insert.sql, self.insert.many(rows))
        return max(cursor.rowcount, 0)


Connect = Callable[[], AbstractContextManager[PoolProxiedConnection]]
"""Lends the connection a ledger transaction runs on, and takes it back; StoreError when none can be had."""


class LedgerAppender:
    """Appends usage rows and events, as checked column values, in one transaction; keeps request bodies in another.

    ``connect`` lends the connection (the store's: on SQLite the one its commit marks are read on, so the
    ledger's own commits do not count as changes to follow)."""

    def __init__(self, engine: Engine, usage: Table, events: Table, bodies: Table, connect: Connect) -> None:
        self.engine = engine
        self._connect = connect
        self.usage = _Table(engine, usage)
        self.events = _Table(engine, events)
        dialect = engine.dialect
        convert = {c.name: bind_processor(c, dialect) for c in bodies.columns}
        self.bodies = Statement(
            engine, upsert_rows(dialect.name, bodies, ("request_id",)), list(convert), convert, ordered=True
        )
        self._begin: str | None = None  # SQLite: as the store's writes begin
        self._begin_parameters: Parameters = ()
        if engine.dialect.name != "sqlite":
            # Ids commit in order, for the streams' cursors: see ``events.APPEND_LOCK``.
            lock = Statement(engine, APPEND_LOCK, ["id"])
            self._begin, self._begin_parameters = lock.sql, lock.parameters({"id": APPEND_LOCK_ID})

    def append(self, usage: Sequence[Values], events: Sequence[Values], *, skip_known: bool) -> tuple[int, int]:
        """Store every row, or none; how many usage rows and events were new.

        ``skip_known``: leave out rows whose entry is stored before inserting (a replayed journal
        then consumes no ids); ON CONFLICT skips them either way. InvalidInput when the database
        refuses a row (a constraint); StoreError when it cannot be written at all.
        """
        if not usage and not events:
            return 0, 0
        with self._transaction() as cursor:
            if skip_known:
                usage = self.usage.unknown(cursor, usage) if usage else usage
                events = self.events.unknown(cursor, events) if events else events
            return self.usage.append(cursor, usage), self.events.append(cursor, events)

    def keep_bodies(self, bodies: Sequence[Ordered]) -> None:
        """Insert or replace request bodies (checked column values in the table's order, one per request id), all
        or none."""
        if bodies:
            with self._transaction() as cursor:
                cursor.executemany(self.bodies.sql, self.bodies.many(bodies))

    def _transaction(self) -> AbstractContextManager[DBAPICursor]:
        return write_transaction(self.engine, self._connect, "a ledger batch", self._begin, self._begin_parameters)


@contextmanager
def write_transaction(
    engine: Engine, connect: Connect, what: str, begin: str | None = None, parameters: Parameters = ()
) -> Iterator[DBAPICursor]:
    """One write transaction on the driver's cursor of the connection ``connect`` lends, begun with ``begin`` (none:
    as the store's write transactions begin, ``BEGIN_WRITE`` on SQLite and the driver's own on PostgreSQL) and
    committed at the end; rolled back on any error. InvalidInput when the database refuses a row (a constraint;
    ``what`` names the write), StoreError when it cannot be written."""
    dbapi: DBAPIModule = engine.dialect.loaded_dbapi
    if begin is None and engine.dialect.name == "sqlite":
        begin = BEGIN_WRITE
    with connect() as connection:
        cursor = connection.cursor()
        try:
            # sqlite3 and psycopg both commit and roll back what is open, whatever their autocommit setting.
            if begin is not None:
                cursor.execute(begin, parameters)
            yield cursor
            connection.commit()
        except dbapi.Error as err:
            _roll_back(engine, connection, cursor, err)
            if isinstance(err, dbapi.IntegrityError):
                raise InvalidInput(f"the database refused {what}: {err}") from None
            raise StoreError(f"store at {mask(engine.url)}: {reason(err)}") from err
        except BaseException:
            _roll_back(engine, connection, cursor, None)
            raise
        finally:
            cursor.close()


def _roll_back(
    engine: Engine, connection: PoolProxiedConnection, cursor: DBAPICursor, err: DBAPIModule.Error | None
) -> None:
    """Undo the transaction; a connection the database dropped, or that cannot roll back, leaves the pool."""
    if err is not None and engine.dialect.is_disconnect(err, connection.dbapi_connection, cursor):
        connection.invalidate(err)
        return
    try:
        connection.rollback()
    except engine.dialect.loaded_dbapi.Error as failed:
        connection.invalidate(failed)


def time_forward(engine: Engine, column: Column[Any]) -> Statement:
    """Sets a time that only moves forward (a key's last use, a node's last heartbeat) on a row found by its id,
    for :meth:`Statement.many` with rows of ``stamp`` and ``row_id``: a row whose time is later already keeps it."""
    table = column.table
    assert isinstance(table, Table)
    stamp = bindparam("stamp", type_=column.type)
    clause = (
        update(table)
        .where(table.c.id == bindparam("row_id"), or_(column.is_(None), column < stamp))
        .values({column.name: stamp})
    )
    return Statement(engine, clause, ["stamp", "row_id"], {"stamp": bind_processor(column, engine.dialect)})
