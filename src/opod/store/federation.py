"""Federation peers: other opod clusters, by the name this one gives them, their address and where their key is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg
from opod.store.schema import federation_peers


@dataclass(frozen=True, slots=True)
class PeerRecord:
    name: str
    url: str
    """The peer's client address, without ``/v1``."""
    key_file: str
    """Where the key the peer issued to this cluster is: a file, ``env:NAME`` or ``vault:PATH#FIELD``."""
    send_tags: bool
    created_at: datetime
    created_by: str


class FederationRepo(Repository):
    def federation_peers(self) -> list[PeerRecord]:
        with self._read() as conn:
            rows = conn.execute(select(federation_peers).order_by(federation_peers.c.name)).all()
        return [PeerRecord(**row._mapping) for row in rows]

    def put_federation_peer(self, record: PeerRecord, *, audit: AuditRow | None = None) -> PeerRecord:
        """Add the peer, or change the one of that name (its creation kept); with its audit row."""
        text_arg(record.name, "peer name")
        values = {
            "name": record.name,
            "url": record.url,
            "key_file": record.key_file,
            "send_tags": record.send_tags,
            "created_at": record.created_at,
            "created_by": record.created_by,
        }
        changed = {"url": record.url, "key_file": record.key_file, "send_tags": record.send_tags}
        with self._write() as conn:
            conn.execute(self._upsert(federation_peers, values, on=["name"], update=changed))
            kept = conn.execute(select(federation_peers).where(federation_peers.c.name == record.name)).one()
            if audit is not None:
                insert_audit(conn, audit)
        return PeerRecord(**kept._mapping)

    def remove_federation_peer(self, name: str, *, audit: AuditRow | None = None) -> bool:
        with self._write() as conn:
            gone = conn.execute(delete(federation_peers).where(federation_peers.c.name == name)).rowcount
            if audit is not None:
                insert_audit(conn, audit)
        return bool(gone)
