"""The keys the gateway accepts, in memory: checking a key never touches the store.

The control plane updates this table in the same moment it writes the store, so a
revoked key is refused by the very next request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone, UTC

from opod.gateway.errors import Unauthorized
from opod.security.keys import hash_key


@dataclass(frozen=True, slots=True)
class KeyEntry:
    id: str
    kind: str
    name: str
    hash: str
    expires_at: datetime | None = None
    revoked: bool = False
    team: str = ""
    admission_class: str = ""


class KeyTable:
    def __init__(self) -> None:
        self._by_hash: dict[str, KeyEntry] = {}

    def put(self, entry: KeyEntry) -> None:
        self._by_hash[entry.hash] = entry

    def revoke(self, key_id: str) -> None:
        for digest, entry in list(self._by_hash.items()):
            if entry.id == key_id:
                self._by_hash[digest] = KeyEntry(**{**_fields(entry), "revoked": True})

    def __len__(self) -> int:
        return len(self._by_hash)

    def check(self, authorization: str | None, kinds: tuple[str, ...] = ("api", "admin")) -> KeyEntry:
        """The entry for a ``Bearer`` header, or :class:`Unauthorized` saying what is wrong."""
        if not authorization:
            raise Unauthorized("No API key: send `Authorization: Bearer <key>` (create one with `opod token create`).")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("The Authorization header must be `Bearer <key>`.")
        entry = self._by_hash.get(hash_key(token))
        if entry is None or entry.kind not in kinds:
            raise Unauthorized("This API key is not known here; check it, or create one with `opod token create`.")
        if entry.revoked:
            raise Unauthorized(f"API key {entry.id} was revoked; ask for a new one.")
        if entry.expires_at is not None and entry.expires_at <= datetime.now(UTC):
            raise Unauthorized(f"API key {entry.id} expired at {entry.expires_at:%Y-%m-%d %H:%M} UTC; ask for a new one.")
        return entry


def _fields(entry: KeyEntry) -> dict:
    return {name: getattr(entry, name) for name in entry.__slots__}
