"""The keys the gateway accepts, in memory: checking a key never touches the store.

Two sources feed the table. Keys minted here (``opod token create``, the admin
key) are put and revoked one by one; the control plane updates this table in
the same moment it writes the store, so a revoked key is refused by the very
next request. Keys from a manager's auth file (:mod:`opod.snapshots.auth`)
arrive as one whole snapshot that replaces the previous one in a single
assignment, so a reader sees the old set or the new one, never a mix; the file
never touches a local key.

Only :class:`opod.access.service.AccessService` changes the table; the others read it.
A key that authenticates is noted in memory (a set add) and the service writes
the notes to the store in batches, off the request path.

Tombstones (the auth file's ``revokedKeys``) only ever grow: an id once
tombstoned is refused for as long as this table lives, and the auth file
persists them so a restart does not lift them either.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType

from opod.contract.adminapi import SNAPSHOT_KEY_PREFIX, AdmissionClass
from opod.http.errors import GatewayError, Unauthorized
from opod.security.keys import hash_key

LOCAL = "local"
SNAPSHOT = "snapshot"

BANDS: tuple[str, ...] = tuple(str(c) for c in AdmissionClass)
"""A key's band is its admission class (the gateway's ``CLASSES``, highest first); empty means ``standard``."""
DEFAULT_PROFILE = "default"
"""The routing profile that is the policy file's routing as it is; a key without one is routed by it. The others
are named in the cluster settings' ``routing_profiles``."""


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
    scope: str = ""
    source: str = LOCAL
    """``local`` (minted here) or ``snapshot`` (from the auth file; ``id`` is ``k_cp_<file id>``)."""
    project_id: str = ""
    """The project the key belongs to (``prj_…``); its team and organization come from ``Tenancy.chain``."""
    user_id: str = ""
    """The person it belongs to (``usr_…``): refused while that person is suspended."""
    routing_profile: str = ""
    expires_s: float | None = field(init=False, repr=False, compare=False)
    """``expires_at`` in POSIX seconds, which every request's check compares with the time (a ``datetime`` costs
    several times as much to read and compare on a request that runs cold)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "expires_s", None if self.expires_at is None else self.expires_at.timestamp())


class StaleSnapshot(GatewayError):
    """Keys from an auth snapshot older than the policy allows: the manager has to write a fresh one."""

    status = 503
    type = "service_unavailable"
    code = "auth_snapshot_stale"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "10"})


@dataclass(frozen=True, slots=True)
class AuthState:
    """What the last applied auth file says, held as one object so it is swapped whole."""

    revision: str
    require_keys: bool
    issued_at: datetime | None
    by_hash: Mapping[str, KeyEntry] = field(default_factory=dict)
    applied_at: datetime | None = None
    """When this leader applied the file: a file key's creation as listed where the file has no ``issuedAt``."""


def snapshot_key_id(file_id: str) -> str:
    """The id a key from the auth file carries here and in usage rows: ``k_cp_<id>``."""
    return file_id if file_id.startswith(SNAPSHOT_KEY_PREFIX) else SNAPSHOT_KEY_PREFIX + file_id


class KeyTable:
    def __init__(self) -> None:
        self._by_hash: dict[str, KeyEntry] = {}
        self._auth: AuthState | None = None
        """None until an auth file is applied: then the leader's own settings hold."""
        self._tombstones: frozenset[str] = frozenset()
        self._suspended: frozenset[str] = frozenset()
        """People whose keys are refused (deactivated by the people area); swapped whole."""
        self._used: set[str] = set()
        """Ids of local keys that authenticated since the last :meth:`take_used`."""
        self.max_snapshot_age_sec = 0
        """The policy's ``auth.maxSnapshotAgeSec``; 0 = fail-static (serve from any snapshot age)."""

    # --- local keys ----------------------------------------------------------

    def put(self, entry: KeyEntry) -> None:
        self._by_hash[entry.hash] = entry

    def revoke(self, key_id: str) -> None:
        for digest, entry in list(self._by_hash.items()):
            if entry.id == key_id:
                self._by_hash[digest] = replace(entry, revoked=True)

    def revoke_many(self, key_ids: Iterable[str]) -> None:
        wanted = set(key_ids)
        for digest, entry in list(self._by_hash.items()):
            if entry.id in wanted:
                self._by_hash[digest] = replace(entry, revoked=True)

    def follow(self, entries: Iterable[KeyEntry]) -> int:
        """Bring in keys as the store holds them (another leader minted or revoked them); returns how many changed.

        Only ever adds a key or revokes one, never lifts a revocation: keys are never un-revoked in the store,
        so a read that overlapped a change made here cannot undo it.
        """
        changed = 0
        for entry in entries:
            known = self._by_hash.get(entry.hash)
            if known is None:
                self._by_hash[entry.hash] = entry
                changed += 1
            elif entry.revoked and not known.revoked:
                self._by_hash[entry.hash] = replace(known, revoked=True)
                changed += 1
        return changed

    def local_entries(self) -> list[KeyEntry]:
        """The keys minted here (the admin key and API keys), revoked ones included."""
        return list(self._by_hash.values())

    def suspend_user(self, user_id: str) -> None:
        self._suspended = self._suspended | {user_id}

    def reinstate_user(self, user_id: str) -> None:
        self._suspended = self._suspended - {user_id}

    def __len__(self) -> int:
        return len(self._by_hash) + (len(self._auth.by_hash) if self._auth else 0)

    # --- the auth file's keys --------------------------------------------------

    def apply_snapshot(
        self, revision: str, require_keys: bool, issued_at: datetime | None, entries: Iterable[KeyEntry]
    ) -> None:
        """Replace every key that came from the auth file with ``entries``, in one assignment.

        A tombstoned entry stays listed so its holder hears "revoked", not "unknown"; it is never accepted.
        """
        by_hash = {e.hash: e for e in entries}
        self._auth = AuthState(revision, require_keys, issued_at, MappingProxyType(by_hash), datetime.now(UTC))

    def add_tombstones(self, key_ids: Iterable[str]) -> frozenset[str]:
        """Refuse these snapshot key ids for good (``bob`` and ``k_cp_bob`` both name ``k_cp_bob``); returns the new ones."""
        ids = {snapshot_key_id(k) for k in key_ids if k}
        new = frozenset(ids - self._tombstones)
        if new:
            self._tombstones = self._tombstones | new
        return new

    @property
    def tombstones(self) -> frozenset[str]:
        return self._tombstones

    @property
    def auth(self) -> AuthState | None:
        """The applied auth file's state, or None when no file was ever applied."""
        return self._auth

    def snapshot_keys(self) -> list[KeyEntry]:
        """The auth file's keys that are accepted (tombstoned ones left out)."""
        if self._auth is None:
            return []
        return [e for e in self._auth.by_hash.values() if e.id not in self._tombstones]

    def require_keys(self, default: bool) -> bool:
        """The auth file's ``requireKeys`` once one is applied, else the leader's own setting."""
        return self._auth.require_keys if self._auth is not None else default

    def snapshot_age_sec(self, now: datetime | None = None) -> float | None:
        """Seconds since the auth file's ``issuedAt``; None when no file or no ``issuedAt`` (age unknown)."""
        auth = self._auth
        if auth is None or auth.issued_at is None:
            return None
        return max(0.0, ((now or datetime.now(UTC)) - auth.issued_at).total_seconds())

    def staleness(self, now: datetime | None = None) -> str | None:
        """Why keys from the auth file are refused right now, or None when they are not."""
        limit = self.max_snapshot_age_sec
        age = self.snapshot_age_sec(now)
        if limit <= 0 or age is None or age <= limit:
            return None
        assert self._auth is not None
        return (
            f"The auth snapshot (revision {self._auth.revision!r}) was issued {int(age)} s ago, older than the "
            f"policy's auth.maxSnapshotAgeSec of {limit} s, so keys from it are refused. The manager must write a "
            f"fresh auth file (a newer issuedAt) more often than every {limit} s, or set maxSnapshotAgeSec to 0 to "
            f"keep serving from the last snapshot."
        )

    # --- checking a request ------------------------------------------------------

    def check(self, authorization: str | None, kinds: tuple[str, ...] = ("api", "admin")) -> KeyEntry:
        """The entry for a ``Bearer`` header, or :class:`Unauthorized` saying what is wrong."""
        admin_only = "api" not in kinds
        if not authorization:
            if admin_only:
                raise Unauthorized(f"No admin key: send `Authorization: Bearer <admin key>`; {self._admin_key_hint()}.")
            raise Unauthorized("No API key: send `Authorization: Bearer <key>` (create one with `opod token create`).")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized(f"The Authorization header must be `Bearer <{'admin key' if admin_only else 'key'}>`.")
        digest = hash_key(token)
        # A local key wins over a file key with the same hash: the file never touches local keys.
        entry = self._by_hash.get(digest)
        if entry is None and self._auth is not None:
            entry = self._auth.by_hash.get(digest)
        if admin_only and entry is not None and entry.kind not in kinds:
            raise Unauthorized(f"This is a client key ({entry.id}), not the admin key; {self._admin_key_hint()}.")
        if entry is None or entry.kind not in kinds:
            if admin_only:
                raise Unauthorized(f"This is not the admin key; {self._admin_key_hint()}.")
            raise Unauthorized("This API key is not known here; check it, or create one with `opod token create`.")
        refused = self.refusal(entry, admin_only=admin_only)
        if refused is not None:
            raise refused
        if entry.source == LOCAL:
            self._used.add(entry.id)
        return entry

    def refusal(self, entry: KeyEntry, *, admin_only: bool = False) -> GatewayError | None:
        """Why a known key is refused now (revoked, tombstoned, from a stale auth file, its person deactivated,
        expired); None when it serves. :meth:`check` and a caller known by id (a batch line) ask the same."""
        noun, renew = ("Admin key", self._admin_key_hint()) if admin_only else ("API key", "ask for a new one")
        if entry.revoked:
            return Unauthorized(f"{noun} {entry.id} was revoked; {renew}.")
        if entry.source == SNAPSHOT:
            if entry.id in self._tombstones:
                return Unauthorized(
                    f"{noun} {entry.id} was revoked by the manager (auth file revokedKeys); ask for a new one."
                )
            stale = self.staleness()
            if stale is not None:
                return StaleSnapshot(stale)
        if entry.user_id and entry.user_id in self._suspended:
            return Unauthorized(
                f"{noun} {entry.id} belongs to a person whose account is deactivated; ask an administrator."
            )
        if entry.expires_s is not None and entry.expires_s <= time.time():
            return Unauthorized(f"{noun} {entry.id} expired at {entry.expires_at:%Y-%m-%d %H:%M} UTC; {renew}.")
        return None

    @staticmethod
    def _admin_key_hint() -> str:
        # Told to anyone who calls without the key: where the key lives in words, never the leader's own path.
        return (
            "the admin key is in admin.key in the leader's OPOD_HOME (~/.opod/admin.key by default); "
            "`opod token create` makes client keys, not admin keys"
        )

    def take_used(self) -> set[str]:
        """The local keys that authenticated since the last call (the auth file's keys are not stored here)."""
        used, self._used = self._used, set()
        return used

    def return_used(self, ids: Iterable[str]) -> None:
        """Put back ids whose use could not be stored, so the next batch carries them."""
        self._used.update(ids)

    def authenticate(self, authorization: str | None, default_require: bool) -> KeyEntry | None:
        """The gateway's check: the caller's key entry, or None for an anonymous request that is allowed.

        When keys are required (the auth file's ``requireKeys``, else ``default_require``)
        a missing or refused key raises. When they are not, a valid key still names the
        caller (for usage rows) and anything else is served anonymously.
        """
        if not authorization and not self.require_keys(default_require):
            return None
        # Whether keys are required changes only what happens to a key that does not pass.
        try:
            return self.check(authorization, kinds=("api", "admin"))
        except GatewayError:
            if self.require_keys(default_require):
                raise
            return None
