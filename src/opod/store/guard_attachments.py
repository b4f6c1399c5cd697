"""Guard attachments: a policy of the settings' ``guard.policies`` attached to an org, team, project, person or key.

One row per (scope, ID, policy), with who attached it and when. Attaching what is attached already changes
nothing (the first attachment's author and time stay). The policy is kept by name and not checked here: a
policy later taken out of the settings leaves its attachments, which the gateway then ignores and
``GET /api/v1/guard`` still lists (:mod:`opod.access.guard_service` is the one writer and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, delete, select

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput, NotFound
from opod.store.schema import GUARD_SCOPES, guard_attachments


@dataclass(frozen=True, slots=True)
class GuardAttachmentRecord:
    scope: str
    """One of :data:`~opod.store.schema.GUARD_SCOPES`."""
    scope_id: str
    policy: str
    created_by: str = ""
    created_at: datetime | None = None


def _record(row: Row[Any]) -> GuardAttachmentRecord:
    m = row._mapping
    return GuardAttachmentRecord(m["scope"], m["scope_id"], m["policy"], m["created_by"], m["created_at"])


def _key(scope: str, scope_id: str, policy: str) -> tuple[str, str, str]:
    if scope not in GUARD_SCOPES:
        raise InvalidInput(f"guard attachment scope {scope!r} is not one of {', '.join(GUARD_SCOPES)}")
    return scope, text_arg(scope_id, "guard attachment scope_id"), text_arg(policy, "guard attachment policy")


class GuardAttachmentsRepo(Repository):
    def list_guard_attachments(self) -> list[GuardAttachmentRecord]:
        """Every attachment, in the order they were made (then by scope, ID and policy)."""
        c = guard_attachments.c
        query = select(guard_attachments).order_by(c.created_at, c.scope, c.scope_id, c.policy)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def add_guard_attachment(
        self,
        scope: str,
        scope_id: str,
        policy: str,
        *,
        by: str,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> tuple[GuardAttachmentRecord, bool]:
        """Attach ``policy`` to ``scope:scope_id``, its audit row in the same transaction; answers the attachment as
        stored and whether it is new (an attachment made before is answered as it is, its author and time kept)."""
        scope, scope_id, policy = _key(scope, scope_id, policy)
        values = {
            "scope": scope,
            "scope_id": scope_id,
            "policy": policy,
            "created_by": text_arg(by, "guard attachment created_by", empty=True),
            "created_at": when(at, "guard attachment created_at"),
        }
        with self._write() as conn:
            added = conn.execute(self._insert_new(guard_attachments, values)).first() is not None
            if audit is not None:
                insert_audit(conn, audit)
            row = conn.execute(select(guard_attachments).where(_where(scope, scope_id, policy))).one()
        return _record(row), added

    def remove_guard_attachment(
        self, scope: str, scope_id: str, policy: str, *, audit: AuditRow | None = None
    ) -> GuardAttachmentRecord:
        """Take ``policy`` off ``scope:scope_id``, its audit row in the same transaction; ``NotFound`` when it is not
        attached there."""
        scope, scope_id, policy = _key(scope, scope_id, policy)
        where = _where(scope, scope_id, policy)
        with self._write() as conn:
            row = conn.execute(select(guard_attachments).where(where)).first()
            if row is None:
                raise NotFound(
                    f"policy {policy!r} is not attached to {scope}:{scope_id}; GET /api/v1/guard lists the attachments"
                )
            conn.execute(delete(guard_attachments).where(where))
            if audit is not None:
                insert_audit(conn, audit)
        return _record(row)


def _where(scope: str, scope_id: str, policy: str) -> Any:
    c = guard_attachments.c
    return and_(c.scope == scope, c.scope_id == scope_id, c.policy == policy)
