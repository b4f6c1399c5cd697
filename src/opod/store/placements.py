"""What is wanted where: restored after a restart, so the fleet converges back to it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Row, delete, select
from sqlalchemy.exc import IntegrityError

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput, NotFound
from opod.store.models import model_not_found
from opod.store.schema import WANTED_STATES, models, placements

Wanted = Literal["loaded", "unloaded"]

ANY_NODE = "*"  # node_id meaning "any worker"


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    model_id: str
    node_id: str  # a node id, or ANY_NODE
    wanted: Wanted
    updated_at: datetime


def _record(row: Row[Any]) -> PlacementRecord:
    return PlacementRecord(**row._mapping)


def _require_model(conn: Connection, model_id: str) -> None:
    if conn.execute(select(models.c.id).where(models.c.id == model_id)).first() is None:
        raise model_not_found(model_id)


class PlacementsRepo(Repository):
    def set_placement(
        self,
        model_id: str,
        node_id: str,
        wanted: Wanted,
        *,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> PlacementRecord:
        """Say that ``model_id`` should be ``wanted`` on ``node_id`` (``*``: any worker); replaces the previous word.

        ``audit`` commits with the change.
        """
        if wanted not in WANTED_STATES:
            raise InvalidInput(f"wanted {wanted!r} is not one of {', '.join(WANTED_STATES)}")
        record = PlacementRecord(
            model_id=text_arg(model_id, "model id"),
            node_id=text_arg(node_id, "node id"),
            wanted=wanted,
            updated_at=when(at, "updated_at"),
        )
        statement = self._upsert(
            placements,
            asdict(record),
            on=["model_id", "node_id"],
            update={"wanted": record.wanted, "updated_at": record.updated_at},
        )
        try:
            with self._write() as conn:
                _require_model(conn, model_id)
                conn.execute(statement)
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:  # the model was removed by another writer in the meantime
            raise model_not_found(model_id) from err
        return record

    def list_placements(self, model_id: str | None = None) -> list[PlacementRecord]:
        """Every placement by model then node; one model's when ``model_id`` is given (NotFound if not added)."""
        query = select(placements).order_by(placements.c.model_id, placements.c.node_id)
        with self._read() as conn:
            if model_id is not None:
                _require_model(conn, model_id)
                query = query.where(placements.c.model_id == model_id)
            return [_record(row) for row in conn.execute(query)]

    def remove_placement(self, model_id: str, node_id: str) -> None:
        with self._write() as conn:
            gone = conn.execute(
                delete(placements).where(placements.c.model_id == model_id, placements.c.node_id == node_id)
            ).rowcount
            if gone == 0:
                _require_model(conn, model_id)
                raise NotFound(f"model {model_id!r} has no placement on node {node_id!r}; list its placements to check")
