"""The presets' state: which bundled models were added as presets, by whom and when, and which were declined.

A row exists once a preset was added (by a person, or ``auto`` by the leader). Removing
that model marks it declined (``ModelsRepo.remove_model``), so the leader does not add it
again by itself; adding it again clears that. The ``presets.auto`` switch is a meta key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository
from opod.store.schema import meta, presets

AUTO_KEY = "presets.auto"


@dataclass(frozen=True, slots=True)
class PresetRecord:
    name: str
    added_by: str  # "auto" when the leader added it, the actor otherwise
    added_at: datetime | None
    declined: bool


def _record(row: Row[Any]) -> PresetRecord:
    return PresetRecord(**row._mapping)


class PresetsRepo(Repository):
    def list_presets(self) -> list[PresetRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(select(presets).order_by(presets.c.name))]

    def presets_auto(self) -> bool:
        """Whether the leader adds a preset by itself when a node fits it; off until someone turns it on."""
        with self._read() as conn:
            return conn.execute(select(meta.c.value).where(meta.c.key == AUTO_KEY)).scalar() == "on"

    def set_presets_auto(self, on: bool, *, audit: AuditRow | None = None) -> None:
        """Turn the adding of presets by themselves on or off; ``audit`` commits with the change."""
        value = "on" if on else "off"
        with self._write() as conn:
            conn.execute(self._upsert(meta, {"key": AUTO_KEY, "value": value}, on=["key"], update={"value": value}))
            if audit is not None:
                insert_audit(conn, audit)
