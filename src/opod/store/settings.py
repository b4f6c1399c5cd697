"""The cluster's settings as numbered versions: each change writes a new version, none is ever rewritten.

A writer names the version it read as its ``base``; the write is refused unless that is still the
newest, so two operators editing the same version never overwrite each other (one of them wins,
the other is told which version to read again).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, insert, select
from sqlalchemy.exc import IntegrityError

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, now, text_arg
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.schema import settings_versions

BODY_MAX = 1 << 20
"""Characters of a settings body kept; a longer one is refused."""
HISTORY_MAX = 1000
VERSION_MAX = 2**63 - 1
"""The largest version number a 64-bit column holds."""


@dataclass(frozen=True, slots=True)
class SettingsRecord:
    version: int
    body: str
    note: str
    at: datetime
    by: str


class StaleBase(Conflict):
    """The write named a base that is no longer the newest version; ``newest`` is the one to read again."""

    def __init__(self, base: int, newest: int) -> None:
        super().__init__(
            f"base {base} is not the newest settings version: version {newest} is; "
            f"read version {newest}, make the change on it, and send it with base {newest}"
        )
        self.base = base
        self.newest = newest


def _record(row: Row[Any]) -> SettingsRecord:
    return SettingsRecord(**row._mapping)


def _body(value: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"settings body must be text, not {type(value).__name__}")
    if len(value) > BODY_MAX:
        raise InvalidInput(f"settings body is {len(value)} characters long; at most {BODY_MAX} are kept")
    if "\x00" in value:
        raise InvalidInput("settings body contains a NUL character")
    return value


class SettingsRepo(Repository):
    def settings_newest(self) -> int:
        """The newest version's number; 0 when none was ever written. One indexed read, cheap enough to poll."""
        with self._read() as conn:
            return int(conn.execute(select(func.max(settings_versions.c.version))).scalar() or 0)

    def settings_version(self, version: int | None = None) -> SettingsRecord | None:
        """Version ``version`` (NotFound when there is none such), or the newest (None when none was written)."""
        if version is not None and (
            isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSION_MAX
        ):
            raise InvalidInput(f"version {version!r} is not a version number (1 or more)")
        query = select(settings_versions)
        if version is None:
            query = query.order_by(settings_versions.c.version.desc()).limit(1)
        else:
            query = query.where(settings_versions.c.version == version)
        with self._read() as conn:
            row = conn.execute(query).first()
        if row is None and version is not None:
            raise NotFound(
                f"settings version {version} does not exist; GET /api/v1/settings/history lists the versions"
            )
        return None if row is None else _record(row)

    def settings_history(self, limit: int = 20) -> list[SettingsRecord]:
        """At most ``limit`` versions, newest first."""
        if not 1 <= limit <= HISTORY_MAX:
            raise InvalidInput(f"limit {limit} is outside 1..{HISTORY_MAX}")
        query = select(settings_versions).order_by(settings_versions.c.version.desc()).limit(limit)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def put_settings(
        self, base: int, body: str, *, note: str = "", by: str, audit: AuditRow | None = None
    ) -> SettingsRecord:
        """Write ``body`` as version ``base + 1``, with ``audit`` in the same transaction.

        Raises StaleBase (a Conflict) unless ``base`` is the newest version (0 when none exists),
        also when another writer with the same base committed first.
        """
        if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base < VERSION_MAX:
            raise InvalidInput(f"base {base!r} is not a version number (0 when no version exists yet)")
        record = SettingsRecord(
            version=base + 1, body=_body(body), note=text_arg(note, "note", empty=True), at=now(), by=text_arg(by, "by")
        )
        try:
            with self._write() as conn:
                newest = int(conn.execute(select(func.max(settings_versions.c.version))).scalar() or 0)
                if newest != base:
                    raise StaleBase(base, newest)
                conn.execute(
                    insert(settings_versions).values(
                        version=record.version,
                        body=record.body,
                        note=record.note,
                        at=record.at,
                        by=record.by,
                    )
                )
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:
            # Another writer with the same base inserted version base + 1 between our read and our insert.
            raise StaleBase(base, base + 1) from err
        return record


__all__ = ["BODY_MAX", "VERSION_MAX", "SettingsRecord", "SettingsRepo", "StaleBase"]
