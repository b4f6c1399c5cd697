"""The one writer of who may call: API keys, the admin key, node tokens and the auth file's keys.

Control (``/api/v1/keys``, ``/api/v1/node-tokens``), the auth file
(:mod:`opod.snapshots.auth`) and the leader (the admin key, the local worker's
token, the node bindings) change access only through :class:`AccessService`.
Each change is written to the store first and then to memory, so what the
gateway reads never runs ahead of what survives a restart. The key table and
the token book it holds are read by the gateway and the join paths.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from opod.access.keytable import KeyEntry, KeyTable
from opod.access.nodetokens import LOCAL_TOKEN_ID, NodeToken, NodeTokenBook
from opod.access.offloop import run_sync
from opod.security.keys import ADMIN_PREFIX, API_PREFIX, display_prefix, hash_key, new_key_id, new_secret
from opod.security.nodetokens import NodeTokenMinter
from opod.store import KeyRecord, Store

log = logging.getLogger("opod.access")

MintedKind = Literal["api", "node"]
"""What ``/api/v1`` mints; the admin key is the leader's own."""

TOMBSTONES_META_KEY = "auth_file.revoked_keys"
"""The store's meta key holding the auth file's revoked key ids, as a JSON list."""


class LocalTokenRevoked(RuntimeError):
    """The local worker's token was revoked: ``opod up`` cannot start its own worker with it."""


@dataclass(frozen=True, slots=True)
class TombstonesAdded:
    new: frozenset[str]
    """Ids refused from now on that were not refused before."""
    persisted: bool
    """False when the store refused the write: they are refused now, but a restart may forget them."""


class AccessService:
    """Writes access to the store, then to memory; :meth:`load` builds it from the store."""

    def __init__(self, store: Store, keys: KeyTable, tokens: NodeTokenBook) -> None:
        """Use :meth:`load`; this takes a table and a book already filled from ``store``."""
        self.store = store
        self.keys = keys
        self.tokens = tokens

    @classmethod
    def load(cls, store: Store, minter: NodeTokenMinter) -> AccessService:
        """Read the keys, node tokens, node bindings and tombstones from the store (at start-up, off the loop)."""
        keys, tokens = KeyTable(), NodeTokenBook(minter)
        for record in store.list_keys():
            if record.kind == "node":
                tokens.put(NodeToken(record.id, record.name, record.expires_at, revoked=record.revoked_at is not None))
            else:
                keys.put(_entry(record))
        for node in store.list_nodes():
            if node.token_id:
                tokens.bind(node.id, node.token_id)
        # Before any auth file: an id revoked before a restart is refused from the first request on.
        keys.add_tombstones(_tombstones(store))
        return cls(store, keys, tokens)

    # --- the leader's own credentials (start-up, off the loop) ------------------------

    def ensure_admin_key(self, path: Path) -> str | None:
        """Make sure ``path`` holds the one active admin key; returns the plaintext when it was created now.

        An admin key whose file is gone or differs can no longer be handed out, so it is revoked.
        """
        self.keys.admin_key_file = path
        admins = [r for r in self.store.list_keys("admin") if r.revoked_at is None]
        if admins and path.exists() and any(r.hash == hash_key(path.read_text().strip()) for r in admins):
            return None
        now = datetime.now(UTC)
        for stale in admins:
            self.store.revoke_key(stale.id, now)
            self.keys.revoke(stale.id)
        secret = new_secret(ADMIN_PREFIX)
        record = self.store.create_key(kind="admin", name="admin", hash=hash_key(secret), prefix=display_prefix(secret))
        self.keys.put(_entry(record))
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
        os.replace(tmp, path)
        return secret

    def local_worker_token(self) -> str:
        """The token ``opod up``'s own worker joins with (stored on first use); blocks on the store."""
        token = self.tokens.minter.token(LOCAL_TOKEN_ID)
        existing = [r for r in self.store.list_keys("node") if r.id == LOCAL_TOKEN_ID]
        if not existing:
            self.store.create_key(kind="node", name="opod up's local worker", hash=hash_key(token),
                                  prefix=display_prefix(token), id=LOCAL_TOKEN_ID)
            self.tokens.put(NodeToken(LOCAL_TOKEN_ID, "local worker"))
        elif existing[0].revoked_at is not None:
            raise LocalTokenRevoked(
                f"the local worker's node token ({LOCAL_TOKEN_ID}) was revoked; run opod up --no-worker, or remove ~/.opod to start afresh")
        return token

    # --- /api/v1 -------------------------------------------------------------------------

    async def create(self, kind: MintedKind, name: str, expires_at: datetime | None = None) -> tuple[KeyRecord, str]:
        """Mint a key or node token; returns its record and its plaintext (shown once, never stored)."""
        now = datetime.now(UTC)
        key_id = new_key_id(kind)
        secret = self.tokens.minter.token(key_id) if kind == "node" else new_secret(API_PREFIX)
        record = await run_sync(self.store.create_key, kind=kind, name=name, hash=hash_key(secret), prefix=display_prefix(secret),
                                expires_at=expires_at, id=key_id, created_at=now)
        if kind == "node":
            self.tokens.put(NodeToken(record.id, record.name, record.expires_at))
        else:
            self.keys.put(_entry(record))
        return record, secret

    async def revoke(self, key_id: str) -> KeyRecord:
        """Revoke a key or node token: refused from the next request on. Raises ``NotFound``."""
        record = await run_sync(self.store.revoke_key, key_id, datetime.now(UTC))
        if record.kind == "node":
            self.tokens.revoke(record.id)
        else:
            self.keys.revoke(record.id)
        return record

    async def list_keys(self, kind: MintedKind) -> list[KeyRecord]:
        return await run_sync(self.store.list_keys, kind)

    async def get_key(self, key_id: str) -> KeyRecord:
        """Raises ``NotFound`` for an unknown id."""
        return await run_sync(self.store.get_key, key_id)

    # --- nodes ------------------------------------------------------------------------------

    def bind_node(self, node_id: str, token_id: str) -> None:
        """The token a registered node signs with from now on; stored with the node's row (``store.upsert_node``)."""
        self.tokens.bind(node_id, token_id)

    def forget_node(self, node_id: str) -> None:
        """A node deleted from the store: its next call must register again, with any active token."""
        self.tokens.unbind(node_id)

    # --- the auth file -----------------------------------------------------------------------

    def add_tombstones(self, key_ids: Collection[str]) -> TombstonesAdded:
        """Refuse the auth file's ``revokedKeys`` for good: stored (merged, never dropped), then refused in memory."""
        new = frozenset(key_ids) - self.keys.tombstones
        persisted = True
        if new:
            try:
                merged = sorted(set(_tombstones(self.store)) | new)
                self.store.set_meta(TOMBSTONES_META_KEY, json.dumps(merged))
            except Exception as err:  # refuse them all the same; the event says a restart could forget them
                persisted = False
                log.error("could not store revoked keys %s: %s", sorted(new), err)
        return TombstonesAdded(self.keys.add_tombstones(new), persisted)

    def apply_auth_file(self, revision: str, require_keys: bool, issued_at: datetime | None, entries: Iterable[KeyEntry]) -> None:
        """Replace the auth file's keys whole (they live in memory only: the manager's file is their store)."""
        self.keys.apply_snapshot(revision, require_keys, issued_at, entries)

    def set_max_snapshot_age(self, seconds: int) -> None:
        """The policy's ``auth.maxSnapshotAgeSec``: how old the auth file's keys may be."""
        self.keys.max_snapshot_age_sec = seconds

    # --- key use ----------------------------------------------------------------------------------

    async def flush_key_uses(self, at: datetime | None = None) -> int:
        """Write the ``last_used_at`` of the keys used since the last flush, in one store call.

        The request path only notes a key id in memory; this runs every few seconds
        and at stop. A failed write keeps the ids for the next flush.
        """
        used = self.keys.take_used()
        if not used:
            return 0
        try:
            return await run_sync(self.store.mark_keys_used, used, at or datetime.now(UTC))
        except Exception as err:
            self.keys.return_used(used)
            log.warning("could not store when %d keys were last used (kept for the next try): %s", len(used), err)
            return 0


def _entry(record: KeyRecord) -> KeyEntry:
    return KeyEntry(record.id, record.kind, record.name, record.hash, record.expires_at, record.revoked_at is not None,
                    record.team, record.admission_class)


def _tombstones(store: Store) -> list[str]:
    text = store.get_meta(TOMBSTONES_META_KEY)
    if not text:
        return []
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"the store's meta {TOMBSTONES_META_KEY!r} does not hold a JSON list of key ids")
    return value
