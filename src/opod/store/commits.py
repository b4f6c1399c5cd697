"""Has anything been committed to the store since? A mark that is cheap to take, for the followers to compare.

SQLite: ``PRAGMA data_version`` on one connection the store holds for it and uses for nothing else. The value
changes when any other connection commits a change (this process's other pooled connections too) and stays
put for reads, for writes that changed no row, and for the pragma itself; a pragma on a local file is cheap
enough to ask on the event loop.

PostgreSQL: ``pg_current_snapshot()`` without its xmin, i.e. the first transaction id not yet completed and
the ones still running below it. Every transaction that took an id and ended (committed or rolled back) moves
one or the other; a read takes none. It counts the whole server's transactions, other databases' too: a
change elsewhere only costs the followers a read. It is a round trip, so it is asked off the loop.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Hashable

from sqlalchemy import text
from sqlalchemy.pool import PoolProxiedConnection

from opod.store.base import Repository
from opod.store.engine import mask
from opod.store.errors import StoreError

_SNAPSHOT = text("SELECT CAST(pg_current_snapshot() AS text)")


class CommitsRepo(Repository):
    _marks: PoolProxiedConnection | None = None
    """SQLite: the connection ``data_version`` is asked on (the value is per connection); taken at the first mark."""
    _marks_lock: threading.Lock
    _marks_opened = 0
    """SQLite: how many such connections were opened; part of the mark, as each counts its own data_version."""

    @property
    def commit_mark_cheap(self) -> bool:
        """True where :meth:`commit_mark` makes no round trip (SQLite), so it may be asked on the event loop."""
        return self.engine.dialect.name == "sqlite"

    def commit_mark(self) -> Hashable:
        """A value that differs from an earlier one when anything was committed to the store in between; equal
        values mean nothing was. Take it before reading what it guards, so a change that lands during the read
        makes the next mark differ."""
        if self.engine.dialect.name != "sqlite":
            with self._read() as conn:
                snapshot = str(conn.execute(_SNAPSHOT).scalar_one())
            return snapshot.partition(":")[2]  # xmin moves only when a listed transaction ends, which the list shows
        with self._marks_lock:
            if self._marks is None:
                self._marks = self.engine.raw_connection()
                self._marks_opened += 1
            try:
                cursor = self._marks.cursor()
                try:
                    cursor.execute("PRAGMA data_version")
                    (version,) = cursor.fetchone() or (0,)
                    return self._marks_opened, int(version)
                finally:
                    cursor.close()
            except sqlite3.Error as err:
                self._marks.invalidate()  # the next mark opens a fresh connection
                self._marks = None
                raise StoreError(f"store at {mask(self.engine.url)}: {err}") from err

    def _close_commit_marks(self) -> None:
        with self._marks_lock:
            if self._marks is not None:
                self._marks.close()
                self._marks = None
