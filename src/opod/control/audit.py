"""The audit of each call on the admin listener and ``/admin/v1``: its draft, and its row once it answered.

Each non-GET call gets an :class:`~opod.store.audit.AuditDraft` on ``request.state.audit``
before its route runs (:func:`open_draft`). A route hands the draft (the dependency
:func:`audit_draft`) to the service that makes the change, which writes the draft's row with
it (``with audit.commit(...) as row``). When the call answered and no change committed a row (a
refusal, or a change the store does not keep), the listener records the draft on its own with
the status it answered (:func:`record_after`). Either way no detail holds a secret
(:func:`opod.store.audit.redact`).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import Request

from opod.store import Store
from opod.store.audit import SOURCE_API, SOURCE_WEB, AuditDraft
from opod.store.errors import StoreError
from opod.store.offloop import run_sync

log = logging.getLogger("opod.control")

_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def open_draft(request: Request, actor: str, body: bytes, *, web: bool = False) -> AuditDraft:
    """The draft of a non-GET call, before its route runs (the listener's middleware); ``web`` for a person's call
    made with a session."""
    parsed: Any = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = f"({len(body)} bytes that are not JSON)"
    source = SOURCE_WEB if web else SOURCE_API
    draft = AuditDraft(actor=actor, source=source, action=f"{request.method} {request.url.path}", body=parsed)
    request.state.audit = draft
    return draft


def settle_route(request: Request, draft: AuditDraft) -> None:
    """Once routed: the action names the route's template (``POST /api/v1/nodes/{id}/state``), the target its ids."""
    route = request.scope.get("route")
    template = getattr(route, "path", None)
    if template:  # as the document writes it: ``{scope:path}`` is ``{scope}``
        draft.action = request.method + " " + _CONVERTER.sub(r"{\1}", template)
    params = request.scope.get("path_params") or {}
    if params and not draft.target:
        draft.target = "/".join(str(v) for v in params.values())
    status = getattr(route, "status_code", None)
    if isinstance(status, int):
        draft.status = status


async def record_now(store: Store, draft: AuditDraft, status: int) -> None:
    """A page's call recorded by the page itself, with the status it answers; the listener records it no more."""
    try:
        with draft.commit(status=status) as row:
            await run_sync(store.record_audit, row)
    except StoreError as err:
        log.error("could not record the audit row of %s: %s", draft.action, err)


async def record_after(store: Store, request: Request, draft: AuditDraft, status: int) -> None:
    """Once a call answered: its row, unless a change committed one (a refusal's status included)."""
    if draft.committed:
        return
    settle_route(request, draft)
    try:
        await run_sync(store.record_audit, draft.after(status))
    except StoreError as err:  # the change stands; the log says its row is missing
        log.error("could not record the audit row of %s: %s", draft.action, err)


def audit_draft(request: Request) -> AuditDraft:
    """The dependency a route takes to commit its audit row with its change."""
    draft: AuditDraft | None = getattr(request.state, "audit", None)
    if draft is None:  # a GET, or an app built without the listener's middleware (a test's)
        draft = AuditDraft(actor="unknown", source=SOURCE_API, action=f"{request.method} {request.url.path}")
        request.state.audit = draft
    settle_route(request, draft)
    return draft
