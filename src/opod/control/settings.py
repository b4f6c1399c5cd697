"""``/settings``: the cluster's settings as a versioned YAML body; a change names the version it was made on.

A body is validated whole before it is kept (the refusal names the line and the field), written
as the next version only when its ``base`` is still the newest (409 naming the newest otherwise),
put in force on this leader at once and on every other leader within 2 s by their poll.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from opod.access.scopes import parse_scope
from opod.contract.admin.records import SettingsRequest, SettingsRollbackRequest, SettingsView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.context import ControlContext, ControlError
from opod.control.spec import SpecRouter
from opod.settings.schema import ClusterSettings
from opod.settings.text import SettingsInvalid, parse_settings
from opod.store.offloop import run_sync
from opod.store.settings import HISTORY_MAX, VERSION_MAX, SettingsRecord, StaleBase

DEFAULT_HISTORY = 20
TARGET = "settings"
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


def _check_scope(text: str, kinds: tuple[str, ...], field: str) -> object:
    return parse_scope(text, kinds=kinds, field=field)


def _parse(body: str, field: str = "body") -> ClusterSettings:
    try:
        return parse_settings(body, check_scope=_check_scope)
    except SettingsInvalid as err:
        raise ControlError(400, f"{field}: {err}; nothing was changed (docs/settings.md lists every key)") from None


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()
    holder = ctx.settings

    def view(record: SettingsRecord | None) -> SettingsView:
        local = holder.local_keys
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

    async def write(
        base: int, body: str, settings: ClusterSettings, note: str, draft: AuditDraft, detail: dict[str, object]
    ) -> SettingsView:
        try:  # the body itself stays out of the detail: it may name secrets
            with draft.commit(target=f"{TARGET}:v{base + 1}", detail=detail) as row:
                record = await run_sync(ctx.store.put_settings, base, body, note=note, by=draft.actor, audit=row)
        except StaleBase as err:
            raise ControlError(409, f"base: {err}") from None
        holder.apply(record.version, settings)
        return view(record)

    @api.get("/api/v1/settings", operation_id="getSettings", tags=["settings"], response_model=SettingsView)
    async def get_settings(response: Response, version: str | None = None) -> SettingsView:
        response.headers[IN_FORCE_HEADER] = str(holder.version)
        if version is None or not version.strip():
            return view(await run_sync(ctx.store.settings_version, None))
        number = _number(version, "version", default=0, low=1, high=VERSION_MAX)
        return view(await run_sync(ctx.store.settings_version, number))

    @api.put("/api/v1/settings", operation_id="putSettings", tags=["settings"], response_model=SettingsView)
    async def put_settings(body: SettingsRequest, draft: AuditDraft = Depends(audit_draft)) -> SettingsView:
        draft.body = {"base": body.base, "note": body.note}  # a refusal's row too: the body itself may name secrets
        if body.body is None:
            raise ControlError(400, "body: missing; send the whole settings text (an empty string means every default)")
        base = body.base or 0
        if not 0 <= base < VERSION_MAX:
            raise ControlError(
                400, f"base: {base} is not a version; send the version you read (0 when none exists yet)"
            )
        settings = _parse(body.body)
        note = body.note or ""
        return await write(base, body.body, settings, note, draft, {"base": base, "note": note})

    @api.get(
        "/api/v1/settings/history",
        operation_id="getSettingsHistory",
        tags=["settings"],
        response_model=list[SettingsView],
    )
    async def get_settings_history(limit: str | None = None) -> list[SettingsView]:
        count = _number(limit, "limit", default=DEFAULT_HISTORY, low=1, high=HISTORY_MAX)
        return [view(r) for r in await run_sync(ctx.store.settings_history, count)]

    @api.post(
        "/api/v1/settings/rollback", operation_id="postSettingsRollback", tags=["settings"], response_model=SettingsView
    )
    async def post_settings_rollback(
        body: SettingsRollbackRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> SettingsView:
        draft.body = {"version": body.version, "note": body.note}
        if body.version is None or not 1 <= body.version <= VERSION_MAX:
            raise ControlError(
                400, "version: send the version to roll back to (GET /api/v1/settings/history lists them)"
            )
        old = await run_sync(ctx.store.settings_version, body.version)
        if old is None:  # settings_version(n) raises NotFound first; this only keeps the type narrow
            raise ControlError(404, f"version: settings version {body.version} does not exist")
        settings = _parse(old.body, f"version {old.version}")
        newest = await run_sync(ctx.store.settings_newest)
        note = body.note or f"rollback to version {old.version}"
        return await write(newest, old.body, settings, note, draft, {"rollback_to": old.version, "note": note})

    return api
