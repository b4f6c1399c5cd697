"""Which database the store opens, and how: URL resolution, SQLite pragmas, transaction starts.

SQLite: WAL (readers never wait for the writer), foreign keys on (SQLite's default is off, and
placements cascade), a busy timeout (a second writer waits instead of failing at once),
synchronous=NORMAL (durable across a process crash; WAL makes it safe against corruption on power
loss, at the cost of the last commits), secure_delete (removed content is zeroed), and incremental
auto-vacuum (a deleted file's pages leave the database file). The file is
made 0600 before SQLite opens it, and SQLite gives its WAL and shared-memory files the same mode.
Write transactions start with ``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of
one failing mid-transaction when it upgrades its lock.

PostgreSQL: ``postgresql+psycopg://`` (psycopg 3 is the driver opod depends on).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection, DBAPICursor
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import ConnectionPoolEntry

from opod import config
from opod.security.private import create_private, private_dir
from opod.store.errors import StoreError

BUSY_TIMEOUT_MS = 10_000
WAL_KEPT_BYTES = 16 << 20
CONNECT_TIMEOUT_S = 10
DB_FILE = "opod.db"
AUTO_VACUUM_INCREMENTAL = 2
"""``PRAGMA auto_vacuum``'s answer for INCREMENTAL."""

# Execution option read by the SQLite "begin" hook: the transaction will write.
WRITE_OPTION = "opod_write"
BEGIN_WRITE = "BEGIN IMMEDIATE"
"""How a write transaction starts on SQLite: two writers queue on the busy timeout instead of failing."""


def mask(url: URL | str) -> str:
    """The URL with its password replaced by ``***``; for messages and logs, even when unparseable."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def reason(err: Exception) -> str:
    """The driver's own first line (e.g. 'connection refused'), without SQLAlchemy's boilerplate.

    ``err`` is SQLAlchemy's DBAPIError, or the driver's own error."""
    orig = getattr(err, "orig", None)
    text = str(orig).strip() if orig is not None else str(err).strip()
    return text.splitlines()[0] if text else type(orig or err).__name__


def resolve_url(url: str | None, home: Path | None) -> URL:
    """The caller's URL, else ``OPOD_DATABASE_URL``, else SQLite at ``<home>/opod.db``."""
    text = url if url is not None else config.read("OPOD_DATABASE_URL")
    if text is None:
        base = home if home is not None else config.home()
        try:
            private_dir(base)
        except OSError as err:
            raise StoreError(
                f"cannot create opod's data directory {base}: {err.strerror}; set OPOD_HOME to a writable directory"
            ) from None
        return URL.create("sqlite", database=str(base / DB_FILE))
    try:
        parsed = make_url(text.strip())
    except ArgumentError:
        raise StoreError(
            f"{mask(text)!r} is not a database URL; use sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST/DB"
        ) from None
    return _check_driver(parsed)


def _check_driver(url: URL) -> URL:
    backend, _, driver = url.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise StoreError(f"{mask(url)}: opod talks to PostgreSQL through psycopg 3; write postgresql+psycopg://…")
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise StoreError(f"{mask(url)}: opod's SQLite store uses Python's sqlite3; write sqlite:///PATH")
        if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
            # A pooled engine would give every connection its own empty database.
            raise StoreError(f"{mask(url)}: an in-memory SQLite store does not persist; give a file, sqlite:///PATH")
        parent = Path(url.database).parent
        if not parent.is_dir():
            raise StoreError(f"{mask(url)}: the directory {parent} does not exist; create it or choose another path")
        return url
    raise StoreError(
        f"{mask(url)}: the store runs on SQLite (sqlite:///PATH) or PostgreSQL (postgresql+psycopg://…), not {backend}"
    )


def sqlite_files(url: URL) -> list[Path]:
    """The SQLite database's files: the database, its WAL and its shared memory; none for PostgreSQL."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return []
    path = Path(url.database)
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


def make_engine(url: URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        create_private(sqlite_files(url)[0])
        engine = create_engine(url)
        _sqlite_hooks(engine)
        return engine
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        # libpq waits forever on a silent host by default; fail the open instead.
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    if "client_encoding" not in url.query:
        # A database created without a locale is SQL_ASCII, where psycopg would hand back bytes.
        connect_args["client_encoding"] = "utf8"
    # pre_ping: a leader outlives PostgreSQL restarts; drop dead pooled connections before use.
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def sqlite_query(engine: Engine, statement: str) -> list[Any]:
    """The rows of one SQLite statement run outside a transaction (a pragma that reads)."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        return list(raw.execute(statement).fetchall())


def sqlite_run(engine: Engine, script: str) -> None:
    """Run SQLite statements that must not run inside a transaction (a checkpoint, VACUUM), each to its end.

    Run to its end matters: ``PRAGMA incremental_vacuum`` frees one page a step, and a cursor's
    ``execute`` takes only the first step.
    """
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.executescript(script)


def use_incremental_vacuum(engine: Engine) -> bool:
    """Make a SQLite database give freed pages back to the file system; True when it was switched now.

    A database made before opod asked for incremental auto-vacuum is rewritten once (VACUUM), which
    takes as long as copying it; later opens find it switched.
    """
    if engine.dialect.name != "sqlite":
        return False
    if sqlite_query(engine, "PRAGMA auto_vacuum") != [(0,)]:
        return False
    sqlite_run(engine, "PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
    return True


def _enable_wal(cursor: DBAPICursor, url: URL) -> None:
    # Two connections switching a new file to WAL at once both hold a shared lock and want an
    # exclusive one; SQLite answers one of them "locked" at once, without the busy handler. Retry.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as err:
            if not ("locked" in str(err) or "busy" in str(err)) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    if mode != "wal":
        raise StoreError(
            f"{mask(url)}: SQLite kept journal mode {mode!r} instead of WAL; put the database on a local disk"
        )


def _sqlite_hooks(engine: Engine) -> None:
    url = engine.url

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        # sqlite3's own transaction handling skips BEGIN before DDL; the "begin" hook below owns it.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Takes effect on a new database, before its first table; an older one is switched once by
            # use_incremental_vacuum. Set only where it is not yet: setting it writes the header, which other
            # connections would count as a change (PRAGMA data_version, opod.store.commits).
            if cursor.execute("PRAGMA auto_vacuum").fetchone() != (AUTO_VACUUM_INCREMENTAL,):
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
            _enable_wal(cursor, url)
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA synchronous = NORMAL")
            # What a delete or an update removes (a client's file, a secret's old value) is overwritten with
            # zeros, not left readable in the file's free pages.
            cursor.execute("PRAGMA secure_delete = ON")
            # A large upload grows the WAL; past a checkpoint it is cut back to this instead of keeping its peak.
            cursor.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(BEGIN_WRITE if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")
