"""Appending the live ledger's rows through the database driver, under one transaction.

The ledger's writer commits every few tens of milliseconds under load, and once per request when
idle. Through SQLAlchemy's execution machinery a one-row commit cost 180 to 380 µs of CPU on
SQLite; on the driver's own cursor it costs about 70 µs (figures in ``docs/dataplane.md``), and the
writer thread holds the GIL, which the event loop waits for, that much less.

The statements are the store's own, compiled once per dialect: ``insert_ignoring_known`` with each
column's bind processor (``UTCDateTime`` to the text SQLite keeps, for one), so a row is stored
exactly as the SQLAlchemy path stores it; the transaction starts the way the store's write
transactions do (``BEGIN_WRITE`` on SQLite, ``serialize_appends``' lock on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ClauseElement, Engine, Table
from sqlalchemy.exc import DBAPIError

from opod.store.engine import BEGIN_WRITE, mask, reason
from opod.store.errors import InvalidInput, StoreError
from opod.store.events import APPEND_LOCK, APPEND_LOCK_ID, insert_ignoring_known


class _Statement:
    """A store statement compiled once for the engine's dialect; its parameters in the driver's form."""

    def __init__(self, engine: Engine, clause: ClauseElement, names: Sequence[str],
                 convert: dict[str, Callable[[Any], Any] | None] | None = None) -> None:
        compiled = clause.compile(dialect=engine.dialect, column_keys=list(names))
        self.sql = compiled.string
        # sqlite3 takes a tuple in the statement's order (qmark); psycopg a dict by name (pyformat).
        self.positional = compiled.positiontup is not None
        self.names = tuple(compiled.positiontup or names)
        self.convert = tuple((convert or {}).get(name) for name in self.names)

    def parameters(self, values: dict[str, Any]) -> tuple | dict[str, Any]:
        converted = [values[name] if convert is None else convert(values[name]) for name, convert in zip(self.names, self.convert)]
        return tuple(converted) if self.positional else dict(zip(self.names, converted))


def _insert(engine: Engine, table: Table) -> _Statement:
    """The store's own INSERT … ON CONFLICT (entry) DO NOTHING (``insert_ignoring_known``), with each
    column's bind processor: a row is stored as the SQLAlchemy path stores it."""
    dialect = engine.dialect
    columns = [c for c in table.columns if not c.primary_key]
    convert = {c.name: c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns}
    return _Statement(engine, insert_ignoring_known(dialect, table), list(convert), convert)


class LedgerAppender:
    """Appends usage rows and events, as column values already made valid, in one transaction."""

    def __init__(self, engine: Engine, usage: Table, events: Table) -> None:
        self.engine = engine
        self.usage = _insert(engine, usage)
        self.events = _insert(engine, events)
        self._dbapi = engine.dialect.dbapi
        if engine.dialect.name == "sqlite":
            self._begin, self._begin_parameters = BEGIN_WRITE, ()
        else:
            # ``serialize_appends``' lock: ids commit in order, for the streams' cursors.
            lock = _Statement(engine, APPEND_LOCK, ["id"])
            self._begin, self._begin_parameters = lock.sql, lock.parameters({"id": APPEND_LOCK_ID})

    def append(self, usage: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]) -> None:
        """Store every row, or none. InvalidInput when the database refuses one (a constraint);
        StoreError when it cannot be written at all."""
        batches = [(insert.sql, [insert.parameters(row) for row in rows])
                   for insert, rows in ((self.usage, usage), (self.events, events)) if rows]
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
