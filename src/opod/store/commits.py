"""Has anything been committed to the store since? A mark that is cheap to take, for the followers to compare.

SQLite: ``PRAGMA data_version`` on one connection the store holds for it, which the ledger's transactions (usage
rows, events, request bodies) also run on, one use at a time. The value changes when any other connection commits
a change (this process's other pooled connections too) and stays put for reads, for writes that changed no row,
for the pragma itself, and for the connection's own commits: a leader busy serving, whose only writes are its
ledger's, leaves it as it was, and the followers read nothing. Asked off the loop, as it may wait for a ledger
transaction to end.

PostgreSQL: ``pg_current_snapshot()`` without its xmin, i.e. the first transaction id not yet completed and
the ones still running below it. Every transaction that took an id and ended (committed or rolled back) moves
one or the other; a read takes none. It counts the whole server's transactions, other databases' too: a
change elsewhere only costs the followers a read. It is a round trip, so it is asked off the loop.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from opod.store.base import Repository
from opod.store.engine import mask, reason
from opod.store.errors import StoreError

_SNAPSHOT = text("SELECT CAST(pg_current_snapshot() AS text)")


class CommitsRepo(Repository):
    _marks: PoolProxiedConnection | None = None
    """SQLite: the connection ``data_version`` is asked on (the value is per connection), which the ledger also
    writes on; taken at its first use."""
    _marks_lock: threading.Lock
    """SQLite: held while that connection is in use, by a mark or a ledger transaction."""
    _marks_opened = 0
    """SQLite: how many such connections were opened; part of the mark, as each counts its own data_version."""

    def commit_mark(self) -> Hashable:
        """A value that differs from an earlier one when anything was committed to the store in between, apart from
        the ledger's own usage rows, events and request bodies on SQLite; equal values mean nothing was. Take it
        before reading what it guards, so a change that lands during the read makes the next mark differ."""
        if self.engine.dialect.name != "sqlite":
            with self._read() as conn:
                snapshot = str(conn.execute(_SNAPSHOT).scalar_one())
            return snapshot.partition(":")[2]  # xmin moves only when a listed transaction ends, which the list shows
        with self._ledger_connection() as connection:
            cursor = connection.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                (version,) = cursor.fetchone() or (0,)
                return self._marks_opened, int(version)
            finally:
                cursor.close()

    def _ledger_lender(self) -> Callable[[], AbstractContextManager[PoolProxiedConnection]]:
        """How the ledger's transactions get their connection: on SQLite the one the marks are read on, whose own
        commits leave its ``data_version`` as it was, so a busy leader's usage rows, events and request bodies are
        no change for the followers to read; from the pool on PostgreSQL."""
        return self._ledger_connection if self.engine.dialect.name == "sqlite" else self._pooled_connection

    @contextmanager
    def _pooled_connection(self) -> Iterator[PoolProxiedConnection]:
        connection = self._connect_raw()
        try:
            yield connection
        finally:
            connection.close()

    @contextmanager
    def _ledger_connection(self) -> Iterator[PoolProxiedConnection]:
        """SQLite: the held connection, for one use at a time; one that failed is let go and the next use opens
        another."""
        with self._marks_lock:
            if self._marks is None:
                self._marks = self._connect_raw()
                self._marks_opened += 1
            try:
                yield self._marks
            except sqlite3.Error as err:
                self._drop_held(err)
                raise StoreError(f"store at {mask(self.engine.url)}: {err}") from err
            except BaseException as err:
                if self._marks is not None and not _is_open(self._marks):
                    self._drop_held(err)
                raise

    def _connect_raw(self) -> PoolProxiedConnection:
        try:
            return self.engine.raw_connection()
        except DBAPIError as err:
            raise StoreError(f"store at {mask(self.engine.url)}: {reason(err)}") from err

    def _drop_held(self, err: BaseException) -> None:
        if self._marks is not None:
            with contextlib.suppress(Exception):
                self._marks.invalidate(err if isinstance(err, Exception) else None)
            self._marks = None

    def _close_commit_marks(self) -> None:
        with self._marks_lock:
            if self._marks is not None:
                self._marks.close()
                self._marks = None


def _is_open(connection: PoolProxiedConnection) -> bool:
    return connection.dbapi_connection is not None
