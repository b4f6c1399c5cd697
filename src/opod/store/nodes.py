"""Registered workers. Drain, cordon, operator labels, engine builds and the wanted release are the
operator's word: they survive re-registration and heartbeats."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select, update

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import json_arg, text_arg, when
from opod.store.commits import CommitsRepo
from opod.store.errors import InvalidInput, NotFound
from opod.store.schema import nodes


@dataclass(frozen=True, slots=True)
class NodeRecord:
    id: str
    hostname: str
    os: str
    arch: str
    ram_gb: float
    address: str
    hardware_json: str  # exactly the text the worker sent
    boot_id: str
    token_id: str | None
    registered_at: datetime  # the latest registration
    last_seen_at: datetime
    drained: bool
    drained_at: datetime | None
    cordoned: bool = False
    operator_labels_json: str = "{}"
    engine_builds_json: str = "{}"
    wanted_version: str = ""

    @property
    def operator_labels(self) -> dict[str, str]:
        return _json_map(self.operator_labels_json)

    @property
    def engine_builds(self) -> dict[str, str]:
        return _json_map(self.engine_builds_json)


def _json_map(text: str) -> dict[str, str]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _record(row: Row[Any]) -> NodeRecord:
    return NodeRecord(**row._mapping)


def _not_found(id: str) -> NotFound:
    return NotFound(f"node {id!r} is not registered; list the nodes to find its id")


class NodesRepo(CommitsRepo):
    def upsert_node(
        self,
        id: str,
        *,
        hostname: str,
        os: str,
        arch: str,
        ram_gb: float,
        address: str,
        hardware_json: str = "{}",
        boot_id: str = "",
        token_id: str | None = None,
        at: datetime | None = None,
    ) -> NodeRecord:
        """Register a node, or re-register it: its description is replaced, its drain is kept."""
        if isinstance(ram_gb, bool) or not isinstance(ram_gb, int | float) or not math.isfinite(ram_gb) or ram_gb < 0:
            raise InvalidInput(f"ram_gb of node {id!r} must be a finite number ≥ 0, not {ram_gb!r}")
        stamp = when(at, "registered_at")
        described = {
            "hostname": text_arg(hostname, "hostname", empty=True),
            "os": text_arg(os, "os", empty=True),
            "arch": text_arg(arch, "arch", empty=True),
            "ram_gb": float(ram_gb),
            "address": text_arg(address, "address", empty=True),
            "hardware_json": json_arg(hardware_json, f"hardware_json of node {id!r}"),
            "boot_id": text_arg(boot_id, "boot_id", empty=True),
            "token_id": text_arg(token_id, "token_id") if token_id is not None else None,
            "registered_at": stamp,
            "last_seen_at": stamp,
        }
        fresh = {"id": text_arg(id, "node id"), "drained": False, "drained_at": None, **described}
        statement = self._upsert(nodes, fresh, on=["id"], update=described)
        with self._write() as conn:
            conn.execute(statement)
            row = conn.execute(select(nodes).where(nodes.c.id == id)).one()
        return _record(row)

    def get_node(self, id: str) -> NodeRecord:
        with self._read() as conn:
            row = conn.execute(select(nodes).where(nodes.c.id == id)).first()
        if row is None:
            raise _not_found(id)
        return _record(row)

    def list_nodes(self) -> list[NodeRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(select(nodes).order_by(nodes.c.id))]

    def set_drained(self, id: str, drained: bool, at: datetime | None = None) -> NodeRecord:
        """Drain (no new work) or undrain a node. Draining a drained node keeps its first drain time."""
        if not isinstance(drained, bool):
            raise InvalidInput(f"drained must be True or False, not {drained!r}")
        stamp = when(at, "drained_at")
        with self._write() as conn:
            if drained:
                change = (
                    update(nodes)
                    .where(nodes.c.id == id, nodes.c.drained.is_(False))
                    .values(drained=True, drained_at=stamp)
                )
            else:
                change = update(nodes).where(nodes.c.id == id).values(drained=False, drained_at=None)
            conn.execute(change)
            row = conn.execute(select(nodes).where(nodes.c.id == id)).first()
        if row is None:
            raise _not_found(id)
        return _record(row)

    def set_state(
        self, id: str, *, drained: bool, cordoned: bool, at: datetime | None = None, audit: AuditRow | None = None
    ) -> NodeRecord:
        """The operator's state at once: draining (``drained``), cordoned, or ready (neither); its audit row in the
        same transaction."""
        if drained and cordoned:
            raise InvalidInput("a node is draining or cordoned, not both")
        stamp = when(at, "drained_at")
        with self._write() as conn:
            if drained:
                conn.execute(update(nodes).where(nodes.c.id == id, nodes.c.drained.is_(False)).values(drained_at=stamp))
            else:
                conn.execute(update(nodes).where(nodes.c.id == id).values(drained_at=None))
            conn.execute(update(nodes).where(nodes.c.id == id).values(drained=drained, cordoned=cordoned))
            row = conn.execute(select(nodes).where(nodes.c.id == id)).first()
            if row is None:
                raise _not_found(id)
            if audit is not None:
                insert_audit(conn, audit)
        return _record(row)

    def set_operator_side(
        self,
        id: str,
        *,
        labels: dict[str, str] | None = None,
        engine_builds: dict[str, str] | None = None,
        wanted_version: str | None = None,
        audit: AuditRow | None = None,
    ) -> NodeRecord:
        """Replace what is given of the operator's labels, engine builds and wanted release; its audit row in the
        same transaction."""
        values: dict[str, Any] = {}
        if labels is not None:
            values["operator_labels_json"] = json.dumps(dict(sorted(labels.items())))
        if engine_builds is not None:
            values["engine_builds_json"] = json.dumps(dict(sorted(engine_builds.items())))
        if wanted_version is not None:
            values["wanted_version"] = text_arg(wanted_version, "wanted_version", empty=True)
        with self._write() as conn:
            if values:
                conn.execute(update(nodes).where(nodes.c.id == id).values(**values))
            row = conn.execute(select(nodes).where(nodes.c.id == id)).first()
            if row is None:
                raise _not_found(id)
            if audit is not None:
                insert_audit(conn, audit)
        return _record(row)

    def touch_nodes(self, ids: list[str], at: datetime | None = None) -> None:
        """Record that these nodes were heard from, in one transaction; ids no longer stored are skipped. Times only move forward."""
        self._move_forward(nodes.c.last_seen_at, ids, at, "node id", "nodes' last heartbeat")

    def delete_node(self, id: str, *, audit: AuditRow | None = None) -> None:
        """Forget a node, its audit row in the same transaction. Its placements by id stay: they say what is wanted
        should it come back."""
        with self._write() as conn:
            if conn.execute(delete(nodes).where(nodes.c.id == id)).rowcount == 0:
                raise _not_found(id)
            if audit is not None:
                insert_audit(conn, audit)
