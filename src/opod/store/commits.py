"""Has anything the followers read changed since? A mark that is cheap to take, for them to compare.

SQLite: ``PRAGMA data_version`` on one connection the store holds for it, which the ledger's transactions (usage
rows, events, request bodies) and the times no follower reads (a key's last use, a node's last heartbeat) also run
on, one use at a time. The value changes when any other connection commits a change (this process's other pooled
connections too) and stays put for reads, for writes that changed no row, for the pragma itself, and for the
connection's own commits: a leader busy serving, whose only writes are its ledger's and those times, leaves it as it
was, and the followers read nothing. Asked off the loop, as it may wait for a ledger
transaction to end.

PostgreSQL: a row changed in a followed table (the keys, people, the tenancy tree, quotas, the settings,
the batches, guard attachments) notifies at its commit (migrations 0024 and 0025; an update of a key's last use
alone does not, 0026), and :class:`ChangeListener` counts the notices of this
store's schema: the ledger's writes, this leader's or another's, are no change, nor is anything of another
schema or database.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Collection, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Column
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from opod.http import cpu
from opod.store.base import Repository, text_arg, when
from opod.store.bulk import Statement, time_forward, write_transaction
from opod.store.engine import mask, reason
from opod.store.errors import StoreError

log = logging.getLogger("opod.store")


class CommitsRepo(Repository):
    _marks: PoolProxiedConnection | None = None
    """SQLite: the connection ``data_version`` is asked on (the value is per connection), which the ledger also
    writes on; taken at its first use."""
    _marks_lock: threading.Lock
    """SQLite: held while that connection is in use, by a mark or a ledger transaction."""
    _marks_opened = 0
    """SQLite: how many such connections were opened; part of the mark, as each counts its own data_version."""
    _listener: ChangeListener | None = None
    """PostgreSQL: what counts the followed tables' changes; started at the first mark."""
    _forward: dict[str, Statement] | None = None
    """:meth:`_move_forward`'s statements by column, compiled at their first use."""

    def commit_mark(self) -> Hashable:
        """A value that differs from an earlier one when something the followers read may have changed in between
        (SQLite: any commit but the held connection's, i.e. the ledger's; PostgreSQL: a change to a followed table,
        counted a moment after its commit); equal values mean nothing did. Take it before reading what it guards,
        so a change that lands during the read makes a later mark differ."""
        if self.engine.dialect.name != "sqlite":
            if self._listener is None:
                self._listener = ChangeListener(self._connect_raw)
            return self._listener.mark()
        with self._ledger_connection() as connection:
            cursor = connection.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                (version,) = cursor.fetchone() or (0,)
                return self._marks_opened, int(version)
            finally:
                cursor.close()

    def _move_forward(
        self, column: Column[Any], ids: Collection[str], at: datetime | None, id_name: str, what: str
    ) -> int:
        """Set ``column``, a time that only moves forward and that no follower reads (a key's last use, a node's last
        heartbeat), to ``at`` (now when ``None``) on the rows of its table with these ids where it is earlier or unset,
        in one transaction; how many rows moved. ``id_name`` names an id, ``what`` the write, in a refusal; an id not
        stored is skipped.

        A busy leader makes such writes every few seconds, and they must not send every leader's followers to read the
        keys, people and tenancy again: on SQLite they are made on the held connection, whose own commits leave its
        ``data_version`` as it was; on PostgreSQL the followed tables' triggers leave out an update of such a time
        alone (migration 0026)."""
        stamp = when(at, column.name)
        wanted = sorted({text_arg(i, id_name) for i in ids})
        if not wanted:
            return 0
        if self._forward is None:
            self._forward = {}
        name = f"{column.table.name}.{column.name}"
        statement = self._forward.get(name)
        if statement is None:
            statement = self._forward[name] = time_forward(self.engine, column)
        with write_transaction(self.engine, self._ledger_lender(), what) as cursor:
            cursor.executemany(statement.sql, statement.many([{"stamp": stamp, "row_id": id} for id in wanted]))
            return max(cursor.rowcount, 0)

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
            if self._listener is not None:
                self._listener.stop()
                self._listener = None


def _is_open(connection: PoolProxiedConnection) -> bool:
    return connection.dbapi_connection is not None


class ChangeListener:
    """PostgreSQL: counts the notifications of changes to the followed tables of this store's schema (migration
    0024, and 0025 for guard attachments), on a connection of its own, in a thread of its own.

    The mark is (how many times it has started listening, how many changes it has counted since). A change is
    notified at its commit and counted a moment later, so a mark taken before a read never misses a change the
    read did not see: either the read saw it, or the count moves after the mark. While it does not listen
    (starting, or reconnecting after the connection broke) every mark is new, so the followers read each time.
    """

    def __init__(self, connect: Callable[[], PoolProxiedConnection]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._stopped = threading.Event()
        self._starts = 0
        self._changes = 0
        self._connection: PoolProxiedConnection | None = None
        self._thread = threading.Thread(target=self._run, name="opod store changes", daemon=True)
        self._thread.start()

    def mark(self) -> Hashable:
        self._listening.wait(LISTEN_WAIT_S)
        with self._lock:
            if not self._listening.is_set():
                return object()  # not listening: nothing can be said, so it is a change
            return self._starts, self._changes

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=NOTIFY_POLL_S * 4)

    def _run(self) -> None:
        cpu.free_this_thread()
        while not self._stopped.is_set():
            try:
                self._listen()
            except Exception as err:  # the server went away: listen again, and count that as a change
                if not self._stopped.is_set():
                    log.warning("store: not told of other leaders' changes for now (%s); listening again", err)
            finally:
                self._listening.clear()
                self._let_go()
            self._stopped.wait(RELISTEN_AFTER_S)

    def _listen(self) -> None:
        self._connection = self._connect()
        dbapi = self._connection.dbapi_connection
        assert dbapi is not None
        dbapi.autocommit = True  # psycopg's: notifications come between transactions
        schema = str(dbapi.execute("SELECT current_schema()").fetchone()[0])
        ours = f"{schema}."
        dbapi.execute(f"LISTEN {CHANNEL}")
        with self._lock:
            self._starts += 1
            self._listening.set()
        while not self._stopped.is_set():
            for notice in dbapi.notifies(timeout=NOTIFY_POLL_S):
                if notice.payload.startswith(ours):
                    with self._lock:
                        self._changes += 1

    def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.invalidate()  # listening: not for the pool to lend again


CHANNEL = "opod_followed"
"""Where the followed tables' triggers notify (migration 0024)."""
LISTEN_WAIT_S = 5.0
"""How long a mark waits for the listener to start listening; past it the mark says "changed"."""
NOTIFY_POLL_S = 0.5
"""How often the listener looks up from its wait to see whether it is told to stop."""
RELISTEN_AFTER_S = 1.0
