"""The portal's keys page: a person's own keys in their projects, a page at a time; making one and revoking one.

Every call goes through :class:`~opod.access.keys.KeyService`, as ``POST /api/v1/keys`` and
``DELETE /api/v1/keys/{id}`` do, and is audited as those calls with the person as the actor and
``source: web``. A person lists, makes and revokes only their own keys, and only in projects that
are theirs (:mod:`opod.control.portal.reach`): a key of another project, or another person's, is
refused 403 and the refusal recorded, nothing changed. A new key's secret is answered once, to the
page that made it, and never stored.
"""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.access.keys import FileKey, KeyOrder, KeyService
from opod.access.tenancy import Tenancy
from opod.control.console.auth import Viewer
from opod.control.console.keys_pages import cursor, key_state
from opod.control.console.kit import Console, Done, Refused, link, page_size
from opod.control.portal.pages import PREFIX
from opod.control.portal.reach import Memberships, Reach, reach_of
from opod.store.audit import AuditDraft
from opod.store.keys import KEY_STATES

NAME_MAX = 100


class PortalKeyPages:
    def __init__(self, portal: Console, *, keys: KeyService, people: Memberships, tenancy: Tenancy) -> None:
        self.portal = portal
        self.keys = keys
        self.people = people
        self.tenancy = tenancy

    def routes(self) -> list[BaseRoute]:
        return [
            Route(f"{PREFIX}/keys", self.portal.page(self.keys_page), methods=["GET"]),
            Route(f"{PREFIX}/keys", self.portal.action("", "POST /api/v1/keys", self.make), methods=["POST"]),
            Route(
                f"{PREFIX}/keys/{{id}}/revoke",
                self.portal.action("", "DELETE /api/v1/keys/{id}", self.revoke, target="key:{id}"),
                methods=["POST"],
            ),
        ]

    def _reach(self, viewer: Viewer) -> Reach:
        return reach_of(viewer, self.people, self.tenancy)

    def _project(self, reach: Reach, text: str, field: str) -> str:
        """The project ``text`` names (ID or path), which must be one of the person's; ``""`` for none given."""
        text = text.strip()
        if not text:
            return ""
        for project in reach.projects:
            if text in (project.id, project.path):
                return project.id
        raise Refused(
            403,
            f"{field}: {text!r} is not one of your projects; you make, list and revoke keys only in projects you are "
            "a member of (ask a manager of the project to add you)",
        )

    async def keys_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        reach = self._reach(viewer)
        project = self._project(reach, q.get("project", ""), "project")
        state = q.get("state", "").strip().lower()
        if state and state not in KEY_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(KEY_STATES)}")
        rows: list[dict[str, object]] = []
        total, earlier, later = 0, "", ""
        if reach.user_id and reach.projects:
            found, total = await self.keys.page(
                "api",
                project=project,
                user=reach.user_id,
                state=state,
                after=cursor(q.get("after", ""), "after"),
                before=cursor(q.get("before", ""), "before"),
                limit=page_size(request),
            )
            now = datetime.now(UTC)
            paths = {p.id: p.path for p in reach.projects}
            rows = [
                {
                    "id": r.id,
                    "name": r.name,
                    "prefix": r.prefix,
                    "state": key_state(r, now),
                    "project": paths.get(r.project_id) or self.tenancy.path(r.project_id) or r.project_id,
                    "created": r.created_at,
                    "expires": r.expires_at,
                    "last_used": r.last_used_at,
                }
                for r in found.keys
            ]
            if rows:
                earlier = link(request, before=found.keys[0].id, after=None) if found.earlier else ""
                later = link(request, after=found.keys[-1].id, before=None) if found.later else ""
        values = {
            "title": "Your keys",
            "rows": rows,
            "total": total,
            "projects": reach.projects,
            "states": KEY_STATES,
            "earlier": earlier,
            "later": later,
            "first": link(request, after=None, before=None),
        }
        return self.portal.render(request, viewer, "portal_keys.html", values)

    async def make(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        reach = self._reach(viewer)
        if not reach.user_id:
            raise Refused(403, "your sign-in names no person of the people area, so no project is yours")
        project = self._project(reach, fields.get("project", ""), "project")
        if not project:
            raise Refused(400, "project: choose one of your projects for the key")
        name = fields.get("name", "").strip()
        if len(name) > NAME_MAX:
            raise Refused(400, f"name: {len(name)} characters; give at most {NAME_MAX}")
        order = KeyOrder(
            name=name or None,
            project=project,
            user=reach.user_id,
            expires_in=fields.get("expires_in", "").strip() or None,
        )
        draft.status = 201  # as POST /api/v1/keys answers
        record, secret = await self.keys.create("api", order, audit=draft)
        return Done(
            f"key {record.id} is made; copy its secret now: it is shown this once",
            data={"secret": secret, "id": record.id},
        )

    async def revoke(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        key_id = request.path_params["id"]
        reach = self._reach(viewer)
        found = await self.keys.find("api", key_id)
        if isinstance(found, FileKey) or not reach.holds(found.project_id):
            raise Refused(
                403,
                f"key {key_id} is not in one of your projects; you revoke only your own keys in projects you are a "
                "member of",
            )
        if found.user_id != reach.user_id:
            raise Refused(403, f"key {key_id} is another person's; a manager of its project revokes it")
        await self.keys.revoke("api", key_id, audit=draft)
        return Done(f"key {key_id} is revoked; it is refused from the next request on")
