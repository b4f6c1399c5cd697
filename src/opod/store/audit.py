"""The audit log: every change made through the management API, who made it, to what, and how it ended.

A change and its audit row commit in one transaction: a repository method that changes
something takes ``audit: AuditRow | None`` and calls :func:`insert_audit` on its own
connection. A call whose row was not written with its change (a refusal, or an area that does
not pass one) is recorded on its own by :meth:`AuditRepo.record_audit`. The writer takes
secrets out of ``detail`` before it gets here (``opod.control.audit.redact``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Connection, Index, Integer, Row, Table, Text, insert, or_, select

from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput
from opod.store.events import CURSOR_ID
from opod.store.schema import UTCDateTime, metadata

DETAIL_MAX = 8192
"""Characters of detail kept; a longer one is cut and says so."""
LIST_MAX = 10_000

audit = Table(
    "audit",
    metadata,
    Column("id", CURSOR_ID, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("status", Integer, nullable=False),
    Index("ix_audit_at", "at"),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True, slots=True)
class AuditRow:
    """A change to record: ``action`` is ``"METHOD /path"``, ``status`` the HTTP status it ended with."""

    actor: str
    source: str
    action: str
    target: str
    detail: str
    status: int
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    at: datetime
    actor: str
    source: str
    action: str
    target: str
    detail: str
    status: int


def _values(row: AuditRow) -> dict[str, Any]:
    if not isinstance(row.status, int) or not 100 <= row.status <= 599:
        raise InvalidInput(f"audit status {row.status!r} is not an HTTP status")
    detail = row.detail if len(row.detail) <= DETAIL_MAX else row.detail[:DETAIL_MAX] + " …(cut)"
    return {
        "at": when(row.at, "audit at"),
        "actor": text_arg(row.actor, "audit actor"),
        "source": text_arg(row.source, "audit source"),
        "action": text_arg(row.action, "audit action"),
        "target": text_arg(row.target, "audit target", empty=True),
        "detail": detail.replace("\x00", ""),
        "status": row.status,
    }


def insert_audit(conn: Connection, row: AuditRow) -> None:
    """Write ``row`` on ``conn``, inside the caller's transaction: it commits or rolls back with the change."""
    conn.execute(insert(audit).values(**_values(row)))


def _record(row: Row[Any]) -> AuditRecord:
    return AuditRecord(**row._mapping)


class AuditRepo(Repository):
    def record_audit(self, row: AuditRow) -> None:
        """Record a call on its own (one that changed nothing, or whose area wrote no row with its change)."""
        with self._write() as conn:
            insert_audit(conn, row)

    def list_audit(
        self, *, since: datetime | None = None, limit: int = 1000, actor: str | None = None, contains: str | None = None
    ) -> list[AuditRecord]:
        """Newest first: at most ``limit`` rows from ``since`` on, by ``actor``, whose action or target holds ``contains``."""
        if limit < 1 or limit > LIST_MAX:
            raise InvalidInput(f"limit {limit} is outside 1..{LIST_MAX}")
        query = select(audit).order_by(audit.c.id.desc()).limit(limit)
        if since is not None:
            query = query.where(audit.c.at >= when(since, "since"))
        if actor:
            query = query.where(audit.c.actor == actor)
        if contains:
            pattern = "%" + contains.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query = query.where(
                or_(audit.c.action.like(pattern, escape="\\"), audit.c.target.like(pattern, escape="\\"))
            )
        with self._read() as conn:
            return [_record(r) for r in conn.execute(query)]


__all__ = ["AuditRecord", "AuditRepo", "AuditRow", "insert_audit"]
