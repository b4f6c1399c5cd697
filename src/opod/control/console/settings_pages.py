"""The console's settings editor: the body in force, checked before it is saved, its diff against its base, history
and rollback.

The page holds the version it was read at (its base). *Check* reads the edited body as a save
would (:meth:`~opod.settings.service.SettingsService.check`) and answers the first problem with its
line and field, or the diff against the base; nothing is written. *Save* is ``PUT /api/v1/settings``
through :meth:`~opod.settings.service.SettingsService.put`: a base that is no longer the newest is
refused 409 and nothing changes, so two people editing at once never overwrite each other.
"""

from __future__ import annotations

import difflib

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.control.console.auth import SETTINGS, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, whole
from opod.settings.service import SettingsService
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict
from opod.store.settings import VERSION_MAX

HISTORY_SHOWN = 20


def diff_lines(before: str, after: str, *, base: int) -> list[tuple[str, str]]:
    """The unified diff of ``before`` (version ``base``) and ``after``, as (kind, line): ``add``, ``del``, ``hunk``
    or ``same``; empty when they are the same."""
    out = []
    for line in difflib.unified_diff(
        before.splitlines(), after.splitlines(), f"version {base}", "edited", lineterm="", n=2
    ):
        if line.startswith(("---", "+++")):
            continue
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "same")
        out.append((kind, line))
    return out


class SettingsPages:
    def __init__(self, console: Console, *, settings: SettingsService) -> None:
        self.console = console
        self.settings = settings

    def routes(self) -> list[BaseRoute]:
        c = self.console
        return [
            Route(f"{PREFIX}/settings", c.page(self.settings_page), methods=["GET"]),
            Route(
                f"{PREFIX}/settings/check",
                c.action(SETTINGS, f"POST {PREFIX}/settings/check", self.check),
                methods=["POST"],
            ),
            Route(f"{PREFIX}/settings", c.action(SETTINGS, "PUT /api/v1/settings", self.save), methods=["POST"]),
            Route(
                f"{PREFIX}/settings/rollback",
                c.action(SETTINGS, "POST /api/v1/settings/rollback", self.rollback),
                methods=["POST"],
            ),
        ]

    async def settings_page(self, request: Request, viewer: Viewer) -> Response:
        asked = whole(request.query_params.get("version"), "version", low=1, high=VERSION_MAX)
        newest = await self.settings.version(None)
        shown = await self.settings.version(asked) if asked is not None else newest
        values = {
            "title": "Settings",
            "base": newest.version if newest is not None else 0,
            "body": shown.body if shown is not None else "",
            "shown": shown.version if shown is not None else 0,
            "in_force": self.settings.in_force,
            "local_keys": self.settings.local_keys,
            "history": await self.settings.history(HISTORY_SHOWN),
        }
        return self.console.render(request, viewer, "settings.html", values)

    async def _base_body(self, base: int) -> str:
        if base == 0:
            return ""
        record = await self.settings.version(base)
        return record.body if record is not None else ""

    async def check(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        """Nothing is written; the call is audited as the console's own (every change's call on the listener is)."""
        base = whole(fields.get("base"), "base", low=0, high=VERSION_MAX, default=0) or 0
        body = fields.get("body", "")
        self.settings.check(body)
        lines = diff_lines(await self._base_body(base), body, base=base)
        said = f"the body is valid; {sum(k in ('add', 'del') for k, _ in lines)} lines differ from version {base}"
        return Done(said if lines else "the body is valid and the same as its base", refresh="", data={"diff": lines})

    async def save(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        base = whole(fields.get("base"), "base", low=0, high=VERSION_MAX, default=None)
        if base is None:
            raise Refused(400, "base: missing; send the version the edit was made on (reload the page)")
        try:
            record = await self.settings.put(base, fields.get("body", ""), note=fields.get("note") or None, audit=draft)
        except Conflict:
            newest = await self.settings.version(None)
            since = (
                f"version {newest.version} was saved by {newest.by}" if newest is not None else "a version was saved"
            )
            raise Refused(
                409,
                f"not saved: {since} after this page read version {base}, and saving would undo it. "
                "Nothing was changed; copy your edit, reload the page, and make it again on the newest version",
            ) from None
        return Done(
            f"saved as version {record.version}; in force on this leader now",
            refresh="",
            data={"version": record.version},
        )

    async def rollback(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        version = whole(fields.get("version"), "version", low=1, high=VERSION_MAX)
        record = await self.settings.rollback(version, note=fields.get("note") or None, audit=draft)
        return Done(
            f"version {version} is in force again, as version {record.version}",
            refresh="",
            data={"version": record.version},
        )
