"""Appending the live ledger's rows through the database driver, under one transaction.

The ledger's writer commits every few tens of milliseconds under load, and once per request when
idle. Through SQLAlchemy's execution machinery a one-row commit cost 180 to 380 µs of CPU on
SQLite; on the driver's own cursor it costs about 70 µs (figures in ``docs/dataplane.md``), and the
writer thread holds the GIL, which the event loop waits for, that much less.

Only the types are SQLAlchemy's: each column's bind processor (``UTCDateTime`` to the text
SQLite keeps, for one) is taken from the table once per dialect, so a row is stored exactly as
the SQLAlchemy path would store it. The statement is the same INSERT … ON CONFLICT (entry) DO
NOTHING on both databases, and the transaction is taken the way the store's hooks take a write
transaction: ``BEGIN IMMEDIATE`` on SQLite, the appends' advisory lock on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, Table
from sqlalchemy.exc import DBAPIError

from opod.store.engine import mask, reason
from opod.store.errors import InvalidInput, StoreError
from opod.store.events import APPEND_LOCK_ID


class _Insert:
    """One table's INSERT in the dialect's parameter style, and how to turn a row of values into its parameters."""

    def __init__(self, engine: Engine, table: Table) -> None:
        dialect = engine.dialect
        columns = [c for c in table.columns if not c.primary_key]
        marker = {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(dialect.paramstyle)
        if marker is None:
            raise StoreError(f"the {dialect.name} driver's parameter style {dialect.paramstyle!r} is not one opod writes")
        self.names = tuple(c.name for c in columns)
        self.convert: tuple[Callable[[Any], Any] | None, ...] = tuple(
            c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns
        )
        self.sql = (
            f"INSERT INTO {table.name} ({', '.join(self.names)}) VALUES ({', '.join([marker] * len(columns))}) "
            "ON CONFLICT (entry) DO NOTHING"
        )

    def parameters(self, rows: Sequence[dict[str, Any]]) -> list[tuple]:
        pairs = tuple(zip(self.names, self.convert))
        return [tuple(row[name] if convert is None else convert(row[name]) for name, convert in pairs) for row in rows]


class LedgerAppender:
    """Appends usage rows and events, as column values already made valid, in one transaction."""

    def __init__(self, engine: Engine, usage: Table, events: Table) -> None:
        self.engine = engine
        self.usage = _Insert(engine, usage)
        self.events = _Insert(engine, events)
        self._dbapi = engine.dialect.dbapi
        if engine.dialect.name == "sqlite":
            self._begin, self._begin_parameters = "BEGIN IMMEDIATE", ()
        else:
            # The same lock as ``serialize_appends``: ids commit in order, for the streams' cursors.
            self._begin, self._begin_parameters = "SELECT pg_advisory_xact_lock(%s)", (APPEND_LOCK_ID,)

    def append(self, usage: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]) -> None:
        """Store every row, or none. InvalidInput when the database refuses one (a constraint);
        StoreError when it cannot be written at all."""
        batches = [(insert.sql, insert.parameters(rows)) for insert, rows in ((self.usage, usage), (self.events, events)) if rows]
        if not batches:
            return
        try:
            connection = self.engine.raw_connection()
        except DBAPIError as err:
            raise StoreError(f"store at {mask(self.engine.url)}: {reason(err)}") from err
        try:
            cursor = connection.cursor()
            try:
                # sqlite3 and psycopg both commit and roll back what is open, whatever their autocommit setting.
                cursor.execute(self._begin, self._begin_parameters)
                for sql, parameters in batches:
                    cursor.executemany(sql, parameters)
                connection.commit()
            except self._dbapi.Error as err:
                self._roll_back(connection, cursor, err)
                if isinstance(err, self._dbapi.IntegrityError):
                    raise InvalidInput(f"the database refused a ledger batch: {err}") from None
                raise StoreError(f"store at {mask(self.engine.url)}: {reason(err)}") from err
            except BaseException:
                self._roll_back(connection, cursor, None)
                raise
            finally:
                cursor.close()
        finally:
            connection.close()

    def _roll_back(self, connection: Any, cursor: Any, err: BaseException | None) -> None:
        """Undo the batch; a connection the database dropped, or that cannot roll back, leaves the pool."""
        if err is not None and self.engine.dialect.is_disconnect(err, connection.dbapi_connection, cursor):
            connection.invalidate(err)
            return
        try:
            connection.rollback()
        except self._dbapi.Error as failed:
            connection.invalidate(failed)
