"""The one writer of the cluster's settings: a new version (a put or a rollback) to the store, then in force here.

A body is read whole before it is kept (:func:`opod.settings.text.parse_settings`: every problem
with its line and field), written as version ``base + 1`` only while ``base`` is still the newest
(a stale base is a :class:`~opod.store.errors.Conflict` naming the newest), in one transaction
with its audit row, then put in force in the :class:`~opod.settings.holder.SettingsHolder`, whose
subscribers follow. Other leaders take the version from the store within 2 s (their holders follow it).

An empty body (no text, or only blanks) puts every key back to its default. Since that undoes
every setting at once, a put takes it only when ``base`` is given too: a body left out, or an
empty one without the version it was made on, is refused and nothing changes.
"""

from __future__ import annotations

from typing import Protocol

from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.settings.text import SettingsInvalid, parse_settings
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.offloop import run_sync
from opod.store.settings import VERSION_MAX, SettingsRecord, StaleBase

TARGET = "settings"


class ScopeSyntax(Protocol):
    """Reads a scope text the settings name (``opod.access.scopes.check_scope``; ``access`` sits above ``settings``).

    Raises ``ValueError`` naming ``field`` when ``text`` is not written as a scope of ``kinds``; whether it names
    something that exists is decided where it is used, so a rollback to a body naming a removed project still works.
    """

    def __call__(self, text: str, kinds: tuple[str, ...], field: str, /) -> object: ...


class SettingsService:
    """Writes settings versions: the store first, with the change's audit row, then the holder in force here."""

    def __init__(self, store: Store, holder: SettingsHolder, scopes: ScopeSyntax) -> None:
        self.store = store
        self.holder = holder
        self.scopes = scopes

    # --- reads -------------------------------------------------------------------------------------

    @property
    def in_force(self) -> int:
        """The version in force on this leader (each leader follows the store on its own); 0 before any."""
        return self.holder.version

    @property
    def local_keys(self) -> list[str]:
        """The keys this leader's own environment overrides, dotted (``prometheus.url``)."""
        return self.holder.local_keys

    async def version(self, version: int | None = None) -> SettingsRecord | None:
        """Version ``version`` (``NotFound`` when there is none such), or the newest (None when none was written)."""
        return await run_sync(self.store.settings_version, version)

    async def history(self, limit: int) -> list[SettingsRecord]:
        """At most ``limit`` versions (1 to ``HISTORY_MAX``), newest first."""
        return await run_sync(self.store.settings_history, limit)

    def check(self, body: str) -> ClusterSettings:
        """``body`` read as a whole settings version would be, nothing written: ``InvalidInput`` naming the line
        and field of the first problem (what an editor shows before its save)."""
        return self._parse(body, "body")

    # --- changes -----------------------------------------------------------------------------------

    async def put(self, base: int | None, body: str | None, *, note: str | None, audit: AuditDraft) -> SettingsRecord:
        """Write ``body`` as version ``base + 1``. ``InvalidInput`` for a body that is missing, empty without a
        base, or not valid settings; ``Conflict`` when ``base`` is not the newest version."""
        audit.body = {"base": base, "note": note}  # a refusal's row too: the body itself may name secrets
        if body is None:
            raise InvalidInput("body: missing; send the whole settings text (an empty string means every default)")
        number = base or 0
        if not 0 <= number < VERSION_MAX:
            raise InvalidInput(f"base: {number} is not a version; send the version you read (0 when none exists yet)")
        if not body.strip() and base is None:
            raise InvalidInput(
                "body: empty, which puts every setting back to its default; to mean that, send it with base "
                "(the version you read); nothing was changed"
            )
        settings = self._parse(body, "body")
        kept = note or ""
        return await self._write(number, body, settings, kept, audit, {"base": number, "note": kept})

    async def rollback(self, version: int | None, *, note: str | None, audit: AuditDraft) -> SettingsRecord:
        """Write version ``version``'s body again as the newest version. ``NotFound`` when there is none such."""
        audit.body = {"version": version, "note": note}
        if version is None or not 1 <= version <= VERSION_MAX:
            raise InvalidInput("version: send the version to roll back to (GET /api/v1/settings/history lists them)")
        old = await run_sync(self.store.settings_version, version)
        if old is None:  # settings_version(n) raises NotFound first; this only keeps the type narrow
            raise NotFound(f"version: settings version {version} does not exist")
        settings = self._parse(old.body, f"version {old.version}")
        newest = await run_sync(self.store.settings_newest)
        kept = note or f"rollback to version {old.version}"
        return await self._write(newest, old.body, settings, kept, audit, {"rollback_to": old.version, "note": kept})

    async def _write(
        self, base: int, body: str, settings: ClusterSettings, note: str, audit: AuditDraft, detail: dict[str, object]
    ) -> SettingsRecord:
        try:  # the body stays out of the detail: it may name secrets
            with audit.commit(target=f"{TARGET}:v{base + 1}", detail=detail) as row:
                record = await run_sync(self.store.put_settings, base, body, note=note, by=audit.actor, audit=row)
        except StaleBase as err:
            raise Conflict(f"base: {err}") from None
        self.holder.apply(record.version, settings)
        return record

    def _parse(self, body: str, field: str) -> ClusterSettings:
        try:
            return parse_settings(body, check_scope=self.scopes)
        except SettingsInvalid as err:
            raise InvalidInput(f"{field}: {err}; nothing was changed (docs/settings.md lists every key)") from None
