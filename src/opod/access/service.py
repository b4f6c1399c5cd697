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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from opod.access.keytable import KeyEntry, KeyTable
from opod.access.nodetokens import LOCAL_TOKEN_ID, NodeToken, NodeTokenBook
from opod.security.keys import ADMIN_PREFIX, API_PREFIX, display_prefix, hash_key, new_key_id, new_secret
from opod.security.nodetokens import NodeTokenMinter
from opod.store import KeyRecord, Store
from opod.store.audit import AuditRow
from opod.store.keys import KeyFilter, KeyPage
from opod.store.offloop import run_sync

log = logging.getLogger("opod.access")

MintedKind = Literal["api", "node"]
"""What ``/api/v1`` mints; the admin key is the leader's own."""

TOMBSTONES_META_KEY = "auth_file.revoked_keys"
"""The store's meta key holding the auth file's revoked key ids, as a JSON list."""
FOLLOW_OVERLAP = timedelta(minutes=5)
"""How far before the newest change already read each read of other leaders' key changes starts again: a key's
times are its writer's clock at the call, so this covers a slow commit and leaders' clocks apart by less."""
FOLLOWED_KINDS = ("admin", "api", "node")
"""The keys other leaders' changes are followed for: every kind, since each leader's admin key opens them all."""


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

    def __init__(self, store: Store, keys: KeyTable, tokens: NodeTokenBook, *, seen: datetime | None = None) -> None:
        """Use :meth:`load`; this takes a table and a book already filled from ``store``, whose newest key change
        (a creation or revocation of an API key or node token) is ``seen``."""
        self.store = store
        self.keys = keys
        self.tokens = tokens
        self._seen = seen
        self._node_tokens: dict[str, bool] = {}
        """Each node token known here and whether it is revoked, so :meth:`follow` only adds or revokes."""

    @classmethod
    def load(cls, store: Store, minter: NodeTokenMinter) -> AccessService:
        """Read the keys, node tokens, node bindings and tombstones from the store (at start-up, off the loop)."""
        keys, tokens = KeyTable(), NodeTokenBook(minter)
        records = store.list_keys()
        for record in records:
            if record.kind == "node":
                tokens.put(NodeToken(record.id, record.name, record.expires_at, revoked=record.revoked_at is not None))
            else:
                keys.put(_entry(record))
        for node in store.list_nodes():
            if node.token_id:
                tokens.bind(node.id, node.token_id)
        # Before any auth file: an id revoked before a restart is refused from the first request on.
        keys.add_tombstones(_tombstones(store))
        service = cls(store, keys, tokens, seen=_newest_change(r for r in records if r.kind in FOLLOWED_KINDS))
        service._node_tokens = {r.id: r.revoked_at is not None for r in records if r.kind == "node"}
        return service

    # --- the leader's own credentials (start-up, off the loop) ------------------------

    def ensure_admin_key(self, path: Path, leader_id: str) -> str | None:
        """Make sure ``path`` holds an active admin key of this leader; returns the plaintext when it was created now.

        Several leaders may share one store, each with its own admin key in its own home; ``leader_id`` names this
        one (stable across restarts). When ``path`` holds no active admin key, a new one is minted and this
        leader's earlier ones are revoked with it (they can no longer be handed out), together with any admin key
        that names no leader; another leader's admin key is never revoked here. Every active admin key of the
        cluster opens every leader's admin API: the leaders change one store, so a key held to one leader would
        wall off nothing, and ``opod ctl`` works against any leader with any leader's key.
        """
        held = hash_key(path.read_text().strip()) if path.exists() else None
        active = [r for r in self.store.list_keys("admin") if r.revoked_at is None]
        mine = next((r for r in active if r.hash == held), None)
        if mine is not None:
            if mine.leader_id != leader_id:  # stored before keys named their leader, or this leader's name changed
                self.keys.put(_entry(self.store.claim_admin_key(mine.id, leader_id)))
            return None
        secret = new_secret(ADMIN_PREFIX)
        record, revoked = self.store.replace_admin_key(leader_id, hash=hash_key(secret), prefix=display_prefix(secret))
        self.keys.revoke_many(r.id for r in revoked)
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
            self.store.create_key(
                kind="node",
                name="opod up's local worker",
                hash=hash_key(token),
                prefix=display_prefix(token),
                id=LOCAL_TOKEN_ID,
            )
            self._put_token(NodeToken(LOCAL_TOKEN_ID, "local worker"))
        elif existing[0].revoked_at is not None:
            raise LocalTokenRevoked(
                f"the local worker's node token ({LOCAL_TOKEN_ID}) was revoked; run opod up --no-worker, or remove ~/.opod to start afresh"
            )
        return token

    # --- /api/v1 -------------------------------------------------------------------------

    async def create(
        self,
        kind: MintedKind,
        name: str,
        expires_at: datetime | None = None,
        *,
        project_id: str = "",
        user_id: str = "",
        band: str = "",
        routing_profile: str = "",
        key_id: str | None = None,
        audit: AuditRow | None = None,
    ) -> tuple[KeyRecord, str]:
        """Mint a key or node token; returns its record and its plaintext (shown once, never stored).

        ``band`` is the key's admission class; ``key_id`` a fresh one of :func:`new_key_id` (made here when None),
        given so ``audit`` can name it; the audit row commits with the key.
        """
        now = datetime.now(UTC)
        key_id = key_id or new_key_id(kind)
        secret = self.tokens.minter.token(key_id) if kind == "node" else new_secret(API_PREFIX)
        record = await run_sync(
            self.store.create_key,
            kind=kind,
            name=name,
            hash=hash_key(secret),
            prefix=display_prefix(secret),
            expires_at=expires_at,
            id=key_id,
            created_at=now,
            project_id=project_id,
            user_id=user_id,
            admission_class=band,
            routing_profile=routing_profile,
            audit=audit,
        )
        if kind == "node":
            self._put_token(NodeToken(record.id, record.name, record.expires_at))
        else:
            self.keys.put(_entry(record))
        return record, secret

    async def revoke(self, key_id: str, *, audit: AuditRow | None = None) -> KeyRecord:
        """Revoke a key or node token: refused from the next request on. Raises ``NotFound``."""
        record = await run_sync(self.store.revoke_key, key_id, datetime.now(UTC), audit=audit)
        if record.kind == "node":
            self._revoke_token(record.id)
        else:
            self.keys.revoke(record.id)
        return record

    async def list_keys(self, kind: MintedKind, *, project_id: str | None = None) -> list[KeyRecord]:
        return await run_sync(self.store.list_keys, kind, project_id=project_id)

    async def page_keys(self, which: KeyFilter, *, after: str, before: str, limit: int) -> tuple[KeyPage, int]:
        """One page of the stored keys ``which`` lists (keyset paging on their ids), and how many it lists in all."""
        found = await run_sync(lambda: self.store.page_keys(which, after=after, before=before, limit=limit))
        return found, await run_sync(self.store.count_keys, which)

    # --- people (the people area calls these) ----------------------------------------------

    def suspend_user(self, user_id: str) -> None:
        """Refuse this person's keys from the next request on (401 naming why), until :meth:`reinstate_user`.

        The person's state is the people area's to keep; at start it calls this for each person
        who is deactivated.
        """
        self.keys.suspend_user(user_id)

    def reinstate_user(self, user_id: str) -> None:
        self.keys.reinstate_user(user_id)

    async def revoke_keys(
        self, user_id: str, project_ids: Collection[str] | None = None, *, audit: AuditRow | None = None
    ) -> list[KeyRecord]:
        """Revoke for good a person's keys in ``project_ids`` (all of them when None): store, then memory."""
        revoked = await run_sync(self.store.revoke_user_keys, user_id, project_ids, datetime.now(UTC), audit=audit)
        self.keys.revoke_many(k.id for k in revoked)
        return revoked

    async def get_key(self, key_id: str) -> KeyRecord:
        """Raises ``NotFound`` for an unknown id."""
        return await run_sync(self.store.get_key, key_id)

    def revoked_in_store(self, records: Iterable[KeyRecord]) -> None:
        """Keys the store has revoked already, in a transaction of another area (a membership removed): refused from now."""
        self.keys.revoke_many(r.id for r in records)

    # --- following other leaders of the same store -------------------------------------------

    async def follow(self) -> int:
        """Read the keys created or revoked since shortly before the newest change seen, and apply them; returns how
        many changed here. A cheap query on the keys' times, never the whole table (it grows with every key).
        The leader's :class:`~opod.store.following.Following` calls it when the store changed: keys (admin keys
        too) and node tokens minted or revoked by another leader are in force here within 2 s."""
        since = self._seen - FOLLOW_OVERLAP if self._seen is not None else None
        records = await run_sync(self.store.keys_changed_since, since, FOLLOWED_KINDS)
        changed = self.keys.follow(_entry(r) for r in records if r.kind != "node")
        for record in records:
            if record.kind != "node":
                continue
            revoked, known = record.revoked_at is not None, self._node_tokens.get(record.id)
            if known is None:
                self._put_token(NodeToken(record.id, record.name, record.expires_at, revoked=revoked))
                changed += 1
            elif (
                revoked and not known
            ):  # never the other way: a read that overlapped a revocation here must not lift it
                self._revoke_token(record.id)
                changed += 1
        newest = _newest_change(records)
        if newest is not None and (self._seen is None or newest > self._seen):
            self._seen = newest
        return changed

    def _put_token(self, token: NodeToken) -> None:
        self.tokens.put(token)
        self._node_tokens[token.id] = token.revoked

    def _revoke_token(self, token_id: str) -> None:
        self.tokens.revoke(token_id)
        self._node_tokens[token_id] = True

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

    def apply_auth_file(
        self, revision: str, require_keys: bool, issued_at: datetime | None, entries: Iterable[KeyEntry]
    ) -> None:
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
    return KeyEntry(
        record.id,
        record.kind,
        record.name,
        record.hash,
        record.expires_at,
        record.revoked_at is not None,
        record.team,
        record.admission_class,
        project_id=record.project_id,
        user_id=record.user_id,
        routing_profile=record.routing_profile,
    )


def _newest_change(records: Iterable[KeyRecord]) -> datetime | None:
    """The latest creation or revocation among ``records``."""
    times = [t for r in records for t in (r.created_at, r.revoked_at) if t is not None]
    return max(times, default=None)


def _tombstones(store: Store) -> list[str]:
    text = store.get_meta(TOMBSTONES_META_KEY)
    if not text:
        return []
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"the store's meta {TOMBSTONES_META_KEY!r} does not hold a JSON list of key ids")
    return value
