"""``GET /api/v1/audit``: the audit log as an operator reads it, newest first, filtered by time, actor and text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter

from opod.access.keys import parse_lifetime
from opod.contract.admin.records import StoreAuditEvent
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.store import Store
from opod.store.audit import AuditRecord
from opod.store.offloop import run_sync


def view(record: AuditRecord) -> StoreAuditEvent:
    return StoreAuditEvent(
        id=record.id,
        at=record.at,
        actor=record.actor,
        source=record.source,
        action=record.action,
        target=record.target or None,
        detail=record.detail or None,
        status=record.status,
    )


DEFAULT_SINCE = timedelta(days=7)
DEFAULT_LIMIT = 1000


def router(store: Store) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/audit", operation_id="getAudit", tags=["audit"], response_model=list[StoreAuditEvent])
    async def get_audit(
        since: str | None = None, limit: int | None = None, actor: str | None = None, contains: str | None = None
    ) -> list[StoreAuditEvent]:
        window = parse_lifetime(since, "since") if since else DEFAULT_SINCE
        if limit is not None and not 1 <= limit <= 10_000:
            raise ControlError(
                400,
                f"limit: {limit} is outside 1..10000; ask for fewer events, or narrow with since, actor or contains",
            )
        start = datetime.now(UTC) - window if window else None
        rows = await run_sync(
            store.list_audit,
            since=start,
            limit=limit or DEFAULT_LIMIT,
            actor=actor or None,
            contains=contains or None,
        )
        return [view(r) for r in rows]

    return api
