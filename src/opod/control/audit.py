"""The audit of the management API: every change recorded with its actor, source, action, target, detail and status.

Each non-GET call gets an :class:`AuditDraft` on ``request.state.audit`` before its route
runs. A route whose change and audit row commit together takes the draft as a dependency
(``draft: AuditDraft = Depends(audit_draft)``) and hands ``draft.row(...)`` to the store
method that makes the change; that marks the draft committed. Every other call (a refusal,
or an area whose store writes take no row) is recorded by the listener after its answer,
with the body it was sent as the detail. Either way :func:`redact` takes the secrets out
first: no detail ever holds one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request

from opod.contract.admin.records import StoreAuditEvent
from opod.control.context import ControlContext, ControlError, parse_lifetime
from opod.control.spec import SpecRouter
from opod.store.audit import AuditRecord, AuditRow
from opod.store.offloop import run_sync

SOURCE_API = "api"
SOURCE_WEB = "web"
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
    return (
        cleaned if isinstance(cleaned, str) else json.dumps(cleaned, separators=(",", ":"), sort_keys=True, default=str)
    )


@dataclass(slots=True)
class AuditDraft:
    """One call's audit row in the making; ``committed`` once a route wrote it with its change."""

    actor: str
    source: str
    action: str
    target: str = ""
    status: int = 200
    """The route's success status, filled in once the route is known."""
    committed: bool = False
    body: Any = field(default=None)

    def row(self, *, target: str = "", detail: Any = None, status: int | None = None) -> AuditRow:
        """The row to commit with the change; the listener then records nothing more for this call."""
        self.committed = True
        return AuditRow(
            actor=self.actor,
            source=self.source,
            action=self.action,
            target=target or self.target,
            detail=detail_text(detail if detail is not None else self.body),
            status=status or self.status,
            at=datetime.now(UTC),
        )

    def after(self, status: int) -> AuditRow:
        """The row the listener records for a call whose route wrote none."""
        return AuditRow(
            actor=self.actor,
            source=self.source,
            action=self.action,
            target=self.target,
            detail=detail_text(self.body),
            status=status,
            at=datetime.now(UTC),
        )


def open_draft(request: Request, actor: str, body: bytes) -> AuditDraft:
    """The draft of a non-GET call, before its route runs (the listener's middleware)."""
    parsed: Any = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = f"({len(body)} bytes that are not JSON)"
    draft = AuditDraft(actor=actor, source=SOURCE_API, action=f"{request.method} {request.url.path}", body=parsed)
    request.state.audit = draft
    return draft


def settle_route(request: Request, draft: AuditDraft) -> None:
    """Once routed: the action names the route's template (``POST /api/v1/nodes/{id}/state``), the target its ids."""
    route = request.scope.get("route")
    template = getattr(route, "path", None)
    if template:
        draft.action = f"{request.method} {template}"
    params = request.scope.get("path_params") or {}
    if params and not draft.target:
        draft.target = "/".join(str(v) for v in params.values())
    status = getattr(route, "status_code", None)
    if isinstance(status, int):
        draft.status = status


def audit_draft(request: Request) -> AuditDraft:
    """The dependency a route takes to commit its audit row with its change."""
    draft: AuditDraft | None = getattr(request.state, "audit", None)
    if draft is None:  # a GET, or an app built without the listener's middleware (a test's)
        draft = AuditDraft(actor="unknown", source=SOURCE_API, action=f"{request.method} {request.url.path}")
        request.state.audit = draft
    settle_route(request, draft)
    return draft


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


def router(ctx: ControlContext) -> APIRouter:
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
            ctx.store.list_audit,
            since=start,
            limit=limit or DEFAULT_LIMIT,
            actor=actor or None,
            contains=contains or None,
        )
        return [view(r) for r in rows]

    return api
