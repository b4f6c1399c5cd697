"""Models added to the fleet: a catalog source, or a whole entry for models from outside the catalog."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select
from sqlalchemy.exc import IntegrityError

from opod.store.base import Repository, json_arg, text_arg, when
from opod.store.errors import Conflict, NotFound
from opod.store.schema import models


@dataclass(frozen=True, slots=True)
class ModelRecord:
    id: str  # the served name
    source_json: str
    entry_json: str | None  # set for --gguf PATH and hf:owner/repo models, which have no catalog file
    engine: str  # preferred engine id; empty: let opod choose
    added_at: datetime


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
        at: datetime | None = None,
    ) -> ModelRecord:
        """Add a model under its served name; a name already added is a Conflict."""
        record = ModelRecord(
            id=text_arg(id, "model id"),
            source_json=json_arg(source_json, f"source_json of model {id!r}"),
            entry_json=json_arg(entry_json, f"entry_json of model {id!r}") if entry_json is not None else None,
            engine=text_arg(engine, "engine", empty=True),
            added_at=when(at, "added_at"),
        )
        conflict = Conflict(f"model {id!r} is already added; remove it first or add it under another name")
        try:
            with self._write() as conn:
                if conn.execute(select(models.c.id).where(models.c.id == id)).first() is not None:
                    raise conflict
                conn.execute(models.insert().values(**asdict(record)))
        except IntegrityError as err:  # added by another writer in the meantime
            raise conflict from err
        return record

    def get_model(self, id: str) -> ModelRecord:
        with self._read() as conn:
            row = conn.execute(select(models).where(models.c.id == id)).first()
        if row is None:
            raise model_not_found(id)
        return _record(row)

    def list_models(self) -> list[ModelRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(select(models).order_by(models.c.id))]

    def remove_model(self, id: str) -> None:
        """Remove a model and, by cascade, every placement of it."""
        with self._write() as conn:
            if conn.execute(delete(models).where(models.c.id == id)).rowcount == 0:
                raise model_not_found(id)
