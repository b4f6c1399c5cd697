"""Models added to the fleet: a catalog source, or a whole entry for models from outside the catalog.

Since revision 0004 a model also carries its whole definition (the management API's
``catalog.Model``, as JSON), kept as given so every field a caller set is shown back.
Adding a model with its first placement, or as a preset, is one transaction; so is
removing one, which marks a preset it came from declined.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, delete, select, update
from sqlalchemy.exc import IntegrityError

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, json_arg, text_arg, when
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.schema import WANTED_STATES, models, placements, presets


@dataclass(frozen=True, slots=True)
class ModelRecord:
    id: str  # the served name
    source_json: str
    entry_json: str | None  # set for --gguf PATH and hf:owner/repo models, which have no catalog file
    engine: str  # preferred engine id; empty: let opod choose
    added_at: datetime
    definition_json: str | None = None  # the catalog.Model; None for models added before revision 0004


def _record(row: Row[Any]) -> ModelRecord:
    return ModelRecord(**row._mapping)


def model_not_found(id: str) -> NotFound:
    return NotFound(f"model {id!r} has not been added; add it first, or list the added models to check the name")


class ModelsRepo(Repository):
    def add_model(
        self,
        id: str,
        *,
        source_json: str,
        entry_json: str | None = None,
        engine: str = "",
        definition_json: str | None = None,
        wanted: str | None = None,
        preset_by: str | None = None,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> ModelRecord:
        """Add a model under its served name; a name already added is a Conflict.

        ``wanted`` writes its placement on any worker in the same transaction; ``preset_by``
        records it as a preset added by that actor (``auto`` for the leader), clearing a decline;
        ``audit`` is the change's row, committed with it.
        """
        record = ModelRecord(
            id=text_arg(id, "model id"),
            source_json=json_arg(source_json, f"source_json of model {id!r}"),
            entry_json=json_arg(entry_json, f"entry_json of model {id!r}") if entry_json is not None else None,
            engine=text_arg(engine, "engine", empty=True),
            added_at=when(at, "added_at"),
            definition_json=json_arg(definition_json, f"definition_json of model {id!r}")
            if definition_json is not None
            else None,
        )
        if wanted is not None and wanted not in WANTED_STATES:
            raise InvalidInput(f"wanted {wanted!r} is not one of {', '.join(WANTED_STATES)}")
        conflict = Conflict(f"model {id!r} is already added; remove it first or add it under another name")
        try:
            with self._write() as conn:
                if conn.execute(select(models.c.id).where(models.c.id == id)).first() is not None:
                    raise conflict
                conn.execute(models.insert().values(**asdict(record)))
                if wanted is not None:
                    conn.execute(
                        placements.insert().values(model_id=id, node_id="*", wanted=wanted, updated_at=record.added_at)
                    )
                if preset_by is not None:
                    self._mark_preset(conn, id, text_arg(preset_by, "added_by"), record.added_at)
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:  # added by another writer in the meantime
            raise conflict from err
        return record

    def _mark_preset(self, conn: Connection, name: str, by: str, at: datetime) -> None:
        values = {"name": name, "added_by": by, "added_at": at, "declined": False}
        conn.execute(
            self._upsert(presets, values, on=["name"], update={"added_by": by, "added_at": at, "declined": False})
        )

    def set_definition(
        self,
        id: str,
        definition_json: str,
        *,
        entry_json: str | None = None,
        engine: str | None = None,
        wanted: str | None = None,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> None:
        """Replace a model's definition (and, when given, its entry, engine and what is wanted on any worker) in one transaction.

        ``wanted="unloaded"`` unloads it from the nodes it was pinned to as well; ``audit`` commits with the change.
        """
        if wanted is not None and wanted not in WANTED_STATES:
            raise InvalidInput(f"wanted {wanted!r} is not one of {', '.join(WANTED_STATES)}")
        values: dict[str, Any] = {"definition_json": json_arg(definition_json, f"definition_json of model {id!r}")}
        if entry_json is not None:
            values["entry_json"] = json_arg(entry_json, f"entry_json of model {id!r}")
        if engine is not None:
            values["engine"] = text_arg(engine, "engine", empty=True)
        with self._write() as conn:
            if conn.execute(update(models).where(models.c.id == id).values(**values)).rowcount == 0:
                raise model_not_found(id)
            if wanted is not None:
                stamp = when(at, "updated_at")
                if wanted == "unloaded":  # no replicas wanted: not on any node it was pinned to either
                    conn.execute(
                        update(placements).where(placements.c.model_id == id).values(wanted=wanted, updated_at=stamp)
                    )
                conn.execute(
                    self._upsert(
                        placements,
                        {"model_id": id, "node_id": "*", "wanted": wanted, "updated_at": stamp},
                        on=["model_id", "node_id"],
                        update={"wanted": wanted, "updated_at": stamp},
                    )
                )
            if audit is not None:
                insert_audit(conn, audit)

    def get_model(self, id: str) -> ModelRecord:
        with self._read() as conn:
            row = conn.execute(select(models).where(models.c.id == id)).first()
        if row is None:
            raise model_not_found(id)
        return _record(row)

    def list_models(self) -> list[ModelRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(select(models).order_by(models.c.id))]

    def remove_model(self, id: str, *, audit: AuditRow | None = None) -> bool:
        """Remove a model and, by cascade, every placement and capacity measurement of it.

        A model that came from a preset has that preset marked declined in the same
        transaction, so the leader does not add it again by itself; answers whether it was.
        ``audit`` commits with the removal.
        """
        with self._write() as conn:
            if conn.execute(delete(models).where(models.c.id == id)).rowcount == 0:
                raise model_not_found(id)
            declined = conn.execute(
                update(presets).where(presets.c.name == id, presets.c.added_by != "").values(declined=True)
            ).rowcount
            if audit is not None:
                insert_audit(conn, audit)
        return bool(declined)
