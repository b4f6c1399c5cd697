"""The console's keys page: the stored API keys a page at a time, filtered on the server, and revoking one.

A page is one keyset query on the keys' ids (:meth:`opod.access.keys.KeyService.page`): fifty rows
and a count, however many keys there are, never the whole list. Revoking goes through
:meth:`~opod.access.keys.KeyService.revoke`, as ``DELETE /api/v1/keys/{id}`` does.
"""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.access.keys import KeyService
from opod.access.tenancy import Tenancy
from opod.control.console.auth import KEYS, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, link, page_size
from opod.store.audit import AuditDraft
from opod.store.keys import COUNT_MAX, KEY_STATES, KeyRecord

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def key_state(record: KeyRecord, now: datetime) -> str:
    if record.revoked_at is not None:
        return "revoked"
    return "expired" if record.expires_at is not None and record.expires_at <= now else "active"


def cursor(text: str, field: str) -> str:
    """A page's bound, a key id (``k_`` and hex)."""
    value = text.strip()
    if value and (len(value) > 64 or not set(value.lower()) <= _ID_CHARS):
        raise Refused(400, f"{field}: {value!r} is not a key id; follow the page's own links")
    return value


class KeyPages:
    def __init__(self, console: Console, *, keys: KeyService, tenancy: Tenancy) -> None:
        self.console = console
        self.keys = keys
        self.tenancy = tenancy

    def routes(self) -> list[BaseRoute]:
        return [
            Route(f"{PREFIX}/keys", self.console.page(self.keys_page), methods=["GET"]),
            Route(
                f"{PREFIX}/keys/{{id}}/revoke",
                self.console.action(KEYS, "DELETE /api/v1/keys/{id}", self.revoke, target="key:{id}"),
                methods=["POST"],
            ),
        ]

    async def keys_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        state = q.get("state", "").strip().lower()
        if state and state not in KEY_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(KEY_STATES)}")
        found, total = await self.keys.page(
            "api",
            project=q.get("project", "").strip(),
            search=q.get("q", ""),
            state=state,
            after=cursor(q.get("after", ""), "after"),
            before=cursor(q.get("before", ""), "before"),
            limit=page_size(request),
        )
        now = datetime.now(UTC)
        rows = [
            {
                "id": r.id,
                "name": r.name,
                "prefix": r.prefix,
                "state": key_state(r, now),
                "project": (self.tenancy.path(r.project_id) or r.project_id) if r.project_id else "",
                "created": r.created_at,
                "last_used": r.last_used_at,
            }
            for r in found.keys
        ]
        values = {
            "title": "Keys",
            "rows": rows,
            "total": total,
            "count_max": COUNT_MAX,
            "states": KEY_STATES,
            "earlier": link(request, before=found.keys[0].id, after=None) if found.earlier and rows else "",
            "later": link(request, after=found.keys[-1].id, before=None) if found.later and rows else "",
            "first": link(request, after=None, before=None),
            "file_keys": len(self.keys.file_keys()),
        }
        return self.console.render(request, viewer, "keys.html", values)

    async def revoke(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        key_id = request.path_params["id"]
        await self.keys.revoke("api", key_id, audit=draft)
        return Done(f"key {key_id} is revoked; it is refused from the next request on")
