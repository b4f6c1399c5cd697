"""The audit log: every change made through the management API, who made it, to what, and how it ended.

A change and its audit row commit in one transaction. A call gets an :class:`AuditDraft`
before anything is changed; the service that makes the change writes the draft's row with
it, inside :meth:`AuditDraft.commit`::

    with audit.commit(target=scope) as row:
        await run_sync(store.put_quota, ..., audit=row)

A repository method that changes something takes ``audit: AuditRow | None`` and calls
:func:`insert_audit` on its own connection. The draft counts as committed only once that
block ended without an error, so a refused change (the store's 404, a stale base) is still
recorded, with its refusal's status, by :meth:`AuditRepo.record_audit` once the call has
answered (the listener does it). :func:`redact` takes secrets out of every detail: no row
ever holds one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, Connection, Index, Integer, Row, Table, Text, insert, or_, select

from opod.store.base import Repository, contains_pattern, text_arg, when
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


SOURCE_API = "api"
SOURCE_WEB = "web"
SOURCE_LEADER = "leader"
"""A change the leader made by itself (a preset added while ``presets.auto`` is on)."""
REDACTED = "[redacted]"

_SECRET_FIELDS = re.compile(
    r"(secret|password|passwd|token|value|credential|private|api_?key|authorization|bearer)", re.I
)
"""Field names whose values are never kept (``value`` is what ``PUT /auth/secrets/{name}`` sends)."""
_KEYLIKE = re.compile(r"\b(sk-[A-Za-z0-9._-]{8,}|k_cp_[A-Za-z0-9._-]{8,}|[A-Za-z0-9_-]*\.[A-Za-z0-9]{32,})\b")
"""Text that looks like a key or token wherever it appears (opod's ``sk-…`` secrets and long token tails)."""
_NOT_SECRET = frozenset({"key_id", "token_id", "secret_name", "api_key_id"})


def redact(value: Any) -> Any:
    """``value`` with every secret replaced: by field name at any depth, and any key-like text in strings."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if _secret_field(k) and v not in (None, "", [], {}) else redact(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _KEYLIKE.sub(REDACTED, value)
    return value


def _secret_field(name: object) -> bool:
    return isinstance(name, str) and name.lower() not in _NOT_SECRET and bool(_SECRET_FIELDS.search(name))


def detail_text(detail: Any) -> str:
    """A detail as the audit keeps it: redacted, JSON for structures, text as it is."""
    if detail is None or detail == {} or detail == "":
        return ""
    cleaned = redact(detail)
    if isinstance(cleaned, str):
        return cleaned
    return json.dumps(cleaned, separators=(",", ":"), sort_keys=True, default=str)


@dataclass(slots=True)
class AuditDraft:
    """One call's audit row in the making: who (``actor``, ``source``), what (``action``), and on what.

    ``action`` is ``"METHOD /path template"`` for a call of the API; ``status`` the success status the
    call answers when the change is made; ``body`` what the caller sent (the detail when the change
    names none).
    """

    actor: str
    source: str
    action: str
    target: str = ""
    status: int = 200
    body: Any = None
    _committed: bool = field(default=False, repr=False)

    @property
    def committed(self) -> bool:
        """True once a change wrote this call's row with it (then nothing more is recorded for the call)."""
        return self._committed

    @contextmanager
    def commit(self, *, target: str = "", detail: Any = None, status: int | None = None) -> Iterator[AuditRow]:
        """The row to write with the change, inside its transaction; committed only when the block ends without
        an error, so a change the store refuses leaves the row of its refusal to :meth:`after`."""
        yield AuditRow(
            actor=self.actor,
            source=self.source,
            action=self.action,
            target=target or self.target,
            detail=detail_text(detail if detail is not None else self.body),
            status=status or self.status,
            at=datetime.now(UTC),
        )
        self._committed = True

    def after(self, status: int) -> AuditRow:
        """The row of a call no change wrote a row for: a refusal, or a change that keeps nothing in the store."""
        return AuditRow(
            actor=self.actor,
            source=self.source,
            action=self.action,
            target=self.target,
            detail=detail_text(self.body),
            status=status,
            at=datetime.now(UTC),
        )


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
        self,
        *,
        since: datetime | None = None,
        limit: int = 1000,
        actor: str | None = None,
        contains: str | None = None,
        before: int | None = None,
        source: str | None = None,
    ) -> list[AuditRecord]:
        """Newest first: at most ``limit`` rows from ``since`` on, by ``actor``, whose action or target holds ``contains``;
        only rows older than the row ``before`` (an id: the next page), and only from ``source`` when given."""
        if limit < 1 or limit > LIST_MAX:
            raise InvalidInput(f"limit {limit} is outside 1..{LIST_MAX}")
        query = select(audit).order_by(audit.c.id.desc()).limit(limit)
        if since is not None:
            query = query.where(audit.c.at >= when(since, "since"))
        if actor:
            query = query.where(audit.c.actor == actor)
        if before is not None:
            query = query.where(audit.c.id < before)
        if source:
            query = query.where(audit.c.source == source)
        if contains:
            pattern = contains_pattern(contains)
            query = query.where(
                or_(audit.c.action.like(pattern, escape="\\"), audit.c.target.like(pattern, escape="\\"))
            )
        with self._read() as conn:
            return [_record(r) for r in conn.execute(query)]


__all__ = [
    "SOURCE_API",
    "SOURCE_LEADER",
    "SOURCE_WEB",
    "AuditDraft",
    "AuditRecord",
    "AuditRepo",
    "AuditRow",
    "detail_text",
    "insert_audit",
    "redact",
]
