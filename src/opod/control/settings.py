"""``/settings``: the cluster's settings as a versioned YAML body; a change names the version it was made on.

The rules (a body read whole before it is kept, a base that must still be the newest, an empty
body only with its base) are :class:`opod.settings.service.SettingsService`'s; a new version is in
force on this leader at once and on every other leader within 2 s by their poll.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from opod.contract.admin.records import SettingsRequest, SettingsRollbackRequest, SettingsView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.settings.service import SettingsService
from opod.store.settings import HISTORY_MAX, VERSION_MAX, SettingsRecord

DEFAULT_HISTORY = 20
IN_FORCE_HEADER = "X-Opod-Settings-In-Force"
"""On ``GET /settings``: the version in force on the leader that answered (each leader follows the store on its own)."""


def _number(text: str | None, field: str, *, default: int, low: int, high: int) -> int:
    """A number the spec types as a query string (``?limit=20``, ``?version=3``)."""
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ControlError(400, f"{field}: {text!r} is not a whole number; send one from {low} to {high}") from None
    if not low <= value <= high:
        raise ControlError(400, f"{field}: {value} is outside {low}..{high}")
    return value


def router(settings: SettingsService) -> APIRouter:
    api = SpecRouter()

    def view(record: SettingsRecord | None) -> SettingsView:
        local = settings.local_keys
        if record is None:  # nothing written yet: every default is in force
            return SettingsView(version=0, body="", local_keys=local)
        return SettingsView(
            version=record.version,
            body=record.body,
            note=record.note or None,
            at=record.at,
            by=record.by,
            local_keys=local,
        )

    @api.get("/api/v1/settings", operation_id="getSettings", tags=["settings"], response_model=SettingsView)
    async def get_settings(response: Response, version: str | None = None) -> SettingsView:
        response.headers[IN_FORCE_HEADER] = str(settings.in_force)
        if version is None or not version.strip():
            return view(await settings.version(None))
        return view(await settings.version(_number(version, "version", default=0, low=1, high=VERSION_MAX)))

    @api.put("/api/v1/settings", operation_id="putSettings", tags=["settings"], response_model=SettingsView)
    async def put_settings(body: SettingsRequest, draft: AuditDraft = Depends(audit_draft)) -> SettingsView:
        return view(await settings.put(body.base, body.body, note=body.note, audit=draft))

    @api.get(
        "/api/v1/settings/history",
        operation_id="getSettingsHistory",
        tags=["settings"],
        response_model=list[SettingsView],
    )
    async def get_settings_history(limit: str | None = None) -> list[SettingsView]:
        count = _number(limit, "limit", default=DEFAULT_HISTORY, low=1, high=HISTORY_MAX)
        return [view(r) for r in await settings.history(count)]

    @api.post(
        "/api/v1/settings/rollback", operation_id="postSettingsRollback", tags=["settings"], response_model=SettingsView
    )
    async def post_settings_rollback(
        body: SettingsRollbackRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> SettingsView:
        return view(await settings.rollback(body.version, note=body.note, audit=draft))

    return api
