"""What the registry was last found to have for each model (``GET /api/v1/updates``), so every leader shows the same.

One row per model: the ``modelserve.UpdateInfo`` a check answered, kept whole as JSON, and when.
A check replaces the model's row; a model's row outlives it harmlessly (the listing reads only
the models that have an origin now, and a row whose ``current`` is not what the model runs is
shown as not checked).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Table, Text, select

from opod.store.base import Repository, json_arg, text_arg, when
from opod.store.schema import UTCDateTime, metadata

update_checks = Table(
    "update_checks",
    metadata,
    Column("model", Text, primary_key=True),
    Column("checked_at", UTCDateTime, nullable=False),
    Column("info_json", Text, nullable=False),
)


class UpdateChecksRepo(Repository):
    def put_update_check(self, model: str, info_json: str, *, at: datetime | None = None) -> None:
        """Keep the latest check of ``model``, replacing the one before."""
        values = {
            "model": text_arg(model, "model"),
            "checked_at": when(at, "checked_at"),
            "info_json": json_arg(info_json, f"update check of {model}"),
        }
        statement = self._upsert(
            update_checks,
            values,
            on=["model"],
            update={"checked_at": values["checked_at"], "info_json": values["info_json"]},
        )
        with self._write() as conn:
            conn.execute(statement)

    def update_checks(self) -> dict[str, str]:
        """Every model's latest check, as kept: model → its ``UpdateInfo`` JSON."""
        with self._read() as conn:
            return {row.model: row.info_json for row in conn.execute(select(update_checks))}
