"""Clients' files (OpenAI's Files API): kept in the store in chunks, bounded per project, their space given back on delete.

A file's content lives in the database, not under ``OPOD_HOME``: several leaders sharing PostgreSQL
each answer ``/v1/files/{id}/content`` for any batch, an output file is written in the same
transaction that ends its job, and a backup of the store is a backup of the files. It is kept as
rows of :data:`CHUNK_BYTES` (``file_chunks``), written from a file object a chunk at a time and read
back a chunk at a time, so neither an upload nor a download holds a file whole in memory.

A project's files together are bounded (``files.project_bytes`` in the cluster's settings): the
uploader passes the quota, and :meth:`FilesRepo.add_file` counts and inserts in one transaction,
under a lock per project on PostgreSQL (SQLite's writers queue anyway), so uploads racing each
other never pass it together. A key in no project is bounded on its own.

Deleting a file gives its space back: SQLite runs in incremental auto-vacuum
(:func:`opod.store.engine.use_incremental_vacuum`) and frees the pages at once; PostgreSQL's
autovacuum reuses them by itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Row,
    Table,
    Text,
    delete,
    func,
    insert,
    or_,
    select,
    text,
)

from opod.store.base import Repository, text_arg, when
from opod.store.engine import sqlite_run
from opod.store.errors import InvalidInput, StoreError
from opod.store.schema import UTCDateTime, metadata

FILE_MAX_BYTES = 64 << 20
"""The largest upload kept (64 MiB): a batch is made by reading its input file whole."""
CHUNK_BYTES = 1 << 20
"""Bytes of a file in one ``file_chunks`` row: what an upload or a download holds in memory at a time."""
LIST_MAX = 10_000
QUOTA_LOCK = 0x0F11E5
"""The first half of the PostgreSQL advisory lock a project's uploads take (the second is its scope's hash)."""

files = Table(
    "files",
    metadata,
    Column("id", Text, primary_key=True),
    Column("owner_key_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("purpose", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_files_owner_key_id", "owner_key_id"),
)

# 0016: a file's content, CHUNK_BYTES a row, in order; a file of no bytes has none.
file_chunks = Table(
    "file_chunks",
    metadata,
    Column("file_id", Text, ForeignKey("files.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    owner_key_id: str
    project_id: str
    purpose: str
    filename: str
    bytes: int
    created_at: datetime


class OverQuota(StoreError):
    """A file would take its project's files past their quota; nothing was kept."""

    def __init__(self, *, project_id: str, size: int, used: int, quota: int) -> None:
        whose = f"project {project_id}" if project_id else "this key (in no project)"
        super().__init__(f"{whose} keeps {used} bytes of files; {size} more would pass its quota of {quota} bytes")
        self.project_id, self.size, self.used, self.quota = project_id, size, used, quota


def _file(row: Row[Any]) -> FileRecord:
    return FileRecord(**{c.name: row._mapping[c.name] for c in files.c})


def visible(table: Table, key_id: str | None, project_id: str) -> Any:
    """Rows a key sees: its own, and its project's (a key without a project sees only its own); None: all."""
    if key_id is None:
        return True
    own = table.c.owner_key_id == key_id
    return or_(own, table.c.project_id == project_id) if project_id else own


def limit_arg(limit: int) -> int:
    if not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit: must be a positive integer, not {limit!r}")
    return min(limit, LIST_MAX)


def _size(content: bytes | IO[bytes]) -> int:
    if isinstance(content, bytes):
        return len(content)
    if not (hasattr(content, "seek") and hasattr(content, "tell") and hasattr(content, "read")):
        raise InvalidInput(f"file content must be bytes or a binary file, not {type(content).__name__}")
    size = content.seek(0, 2)
    content.seek(0)
    return size


def _chunks(content: bytes | IO[bytes]) -> Iterator[bytes]:
    if isinstance(content, bytes):
        for start in range(0, len(content), CHUNK_BYTES):
            yield content[start : start + CHUNK_BYTES]
        return
    while chunk := content.read(CHUNK_BYTES):
        yield chunk


def insert_file(conn: Connection, record: FileRecord, content: bytes | IO[bytes]) -> None:
    """The file's row and its chunks, on ``conn`` (in the caller's transaction); ``record.bytes`` is checked against what is read."""
    conn.execute(insert(files).values(**{name: getattr(record, name) for name in record.__slots__}))
    written = 0
    for seq, chunk in enumerate(_chunks(content)):
        conn.execute(insert(file_chunks).values(file_id=record.id, seq=seq, data=chunk))
        written += len(chunk)
    if written != record.bytes:
        raise InvalidInput(f"file {record.id}: {written} bytes were read of the {record.bytes} announced")


def _used(conn: Connection, project_id: str, owner_key_id: str) -> int:
    scope = (
        files.c.project_id == project_id
        if project_id
        else (files.c.project_id == "") & (files.c.owner_key_id == owner_key_id)
    )
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:space, hashtext(:scope))"),
            {"space": QUOTA_LOCK, "scope": project_id or f"key:{owner_key_id}"},
        )
    return int(conn.execute(select(func.coalesce(func.sum(files.c.bytes), 0)).where(scope)).scalar_one())


class FilesRepo(Repository):
    def add_file(
        self,
        *,
        owner_key_id: str,
        project_id: str,
        purpose: str,
        filename: str,
        content: bytes | IO[bytes],
        quota: int | None = None,
        created_at: datetime | None = None,
        id: str | None = None,
    ) -> FileRecord:
        """Keep a file: ``content`` whole, or read from a seekable binary file a chunk at a time.

        ``quota``: the most bytes its project's files (a key in no project: the key's) may hold with
        it; :class:`OverQuota` when it would pass, and nothing is kept.
        """
        size = _size(content)
        if size > FILE_MAX_BYTES:
            raise InvalidInput(f"file is {size} bytes; at most {FILE_MAX_BYTES} are kept")
        record = FileRecord(
            id=text_arg(id, "file id") if id is not None else new_file_id(),
            owner_key_id=text_arg(owner_key_id, "owner key", empty=True),
            project_id=text_arg(project_id, "project", empty=True),
            purpose=text_arg(purpose, "purpose"),
            filename=text_arg(filename, "filename", empty=True),
            bytes=size,
            created_at=when(created_at, "created_at"),
        )
        with self._write() as conn:
            if quota is not None:
                used = _used(conn, record.project_id, record.owner_key_id)
                if used + size > quota:
                    raise OverQuota(project_id=record.project_id, size=size, used=used, quota=quota)
            insert_file(conn, record, content)
        return record

    def get_file(self, id: str, *, key_id: str | None = None, project_id: str = "") -> FileRecord | None:
        """The file ``id`` if it exists and the key sees it (``key_id`` None: any caller)."""
        with self._read() as conn:
            row = conn.execute(select(files).where(files.c.id == id, visible(files, key_id, project_id))).first()
        return None if row is None else _file(row)

    def file_chunk(self, id: str, seq: int) -> bytes | None:
        """The ``seq``-th chunk of the file (from 0), or None past its end or when it was deleted.

        One short transaction a chunk: a download in progress never holds the database."""
        with self._read() as conn:
            value = conn.execute(
                select(file_chunks.c.data).where(file_chunks.c.file_id == id, file_chunks.c.seq == seq)
            ).scalar()
        return None if value is None else bytes(value)

    def file_content(self, id: str) -> bytes | None:
        """The file whole (a batch reads its input so), or None when there is no such file."""
        with self._read() as conn:
            if conn.execute(select(files.c.id).where(files.c.id == id)).first() is None:
                return None
            rows = conn.execute(
                select(file_chunks.c.data).where(file_chunks.c.file_id == id).order_by(file_chunks.c.seq)
            )
            return b"".join(bytes(row.data) for row in rows)

    def list_files(
        self,
        *,
        key_id: str | None = None,
        project_id: str = "",
        purpose: str | None = None,
        limit: int = 10_000,
        newest_first: bool = True,
    ) -> list[FileRecord]:
        order = (files.c.created_at.desc(), files.c.id.desc()) if newest_first else (files.c.created_at, files.c.id)
        query = select(files).where(visible(files, key_id, project_id)).order_by(*order).limit(limit_arg(limit))
        if purpose:
            query = query.where(files.c.purpose == purpose)
        with self._read() as conn:
            return [_file(row) for row in conn.execute(query)]

    def delete_file(self, id: str) -> bool:
        """Forget the file and its chunks; on SQLite the pages they held leave the database file at once."""
        with self._write() as conn:
            deleted = conn.execute(delete(files).where(files.c.id == id)).rowcount > 0
        if deleted and self.engine.dialect.name == "sqlite":
            # The freed pages leave at the vacuum's commit (in the WAL), and the file shrinks when
            # the WAL is copied back: do that now, and empty the WAL too.
            sqlite_run(self.engine, "PRAGMA incremental_vacuum; PRAGMA wal_checkpoint(TRUNCATE);")
        return deleted


__all__ = ["CHUNK_BYTES", "FILE_MAX_BYTES", "FileRecord", "FilesRepo", "OverQuota", "file_chunks", "files"]
