"""Capacity measurements: what one replica of a model's profile was measured to serve (``bench.Capacity``).

One row per model and profile, the latest measurement replacing the one before; kept as
the JSON the management API took, with who measured it. Removed with the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.exc import IntegrityError

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, json_arg, text_arg, when
from opod.store.models import model_not_found
from opod.store.schema import capacity, models


@dataclass(frozen=True, slots=True)
class CapacityRecord:
    model_id: str
    profile: str  # the profile's name; "" when the model has one unnamed profile
    capacity_json: str
    measured_by: str
    measured_at: datetime


def _record(row: Row[Any]) -> CapacityRecord:
    return CapacityRecord(**row._mapping)


class CapacityRepo(Repository):
    def put_capacity(
        self,
        model_id: str,
        profile: str,
        capacity_json: str,
        *,
        measured_by: str = "",
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> CapacityRecord:
        """Keep a measurement of ``model_id`` on ``profile``, replacing the previous one; NotFound if not added.

        ``audit`` commits with the measurement.
        """
        record = CapacityRecord(
            model_id=text_arg(model_id, "model id"),
            profile=text_arg(profile, "profile", empty=True),
            capacity_json=json_arg(capacity_json, f"capacity of model {model_id!r}"),
            measured_by=text_arg(measured_by, "measured_by", empty=True),
            measured_at=when(at, "measured_at"),
        )
        values = asdict(record)
        statement = self._upsert(
            capacity,
            values,
            on=["model_id", "profile"],
            update={k: v for k, v in values.items() if k not in ("model_id", "profile")},
        )
        try:
            with self._write() as conn:
                if conn.execute(select(models.c.id).where(models.c.id == model_id)).first() is None:
                    raise model_not_found(model_id)
                conn.execute(statement)
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:  # the model was removed by another writer in the meantime
            raise model_not_found(model_id) from err
        return record

    def list_capacity(self, model_id: str | None = None) -> list[CapacityRecord]:
        """Every measurement by model then profile; one model's when ``model_id`` is given."""
        query = select(capacity).order_by(capacity.c.model_id, capacity.c.profile)
        if model_id is not None:
            query = query.where(capacity.c.model_id == model_id)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]
