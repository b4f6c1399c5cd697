"""API keys, the admin key and node tokens; the store keeps their SHA-256, never the secret."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import Connection, Row, and_, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from opod.security.keys import hash_key as hash_secret
from opod.security.keys import new_key_id
from opod.store.audit import AuditRow, insert_audit
from opod.store.base import aware, text_arg, when
from opod.store.commits import CommitsRepo
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.schema import KEY_KINDS, key_terms, keys, projects

KeyKind = Literal["admin", "api", "node"]

PREFIX_MAX = 24  # enough to recognise a key in a listing, far too little to use it
_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    kind: KeyKind
    name: str
    hash: str
    prefix: str
    team: str
    admission_class: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    node_id: str | None
    project_id: str = ""
    """The project it belongs to (``prj_…``), or ``""``."""
    user_id: str = ""
    """The person it belongs to (``usr_…``), or ``""``."""
    routing_profile: str = ""
    leader_id: str = ""
    """For an admin key, the leader whose home holds it (:meth:`KeysRepo.replace_admin_key`); ``""`` for other kinds
    and for admin keys stored before keys named their leader."""

    def usable(self, at: datetime) -> bool:
        """Neither revoked nor expired at ``at``."""
        return self.revoked_at is None and (self.expires_at is None or at < self.expires_at)


KEY_STATES = ("active", "revoked", "expired")
"""What a key listing filters by: usable, revoked, or past its expiry without being revoked."""
PAGE_MAX = 500
COUNT_MAX = 10_000
"""Keys a listing counts before it says only that there are more."""


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of keys in id order, and whether there are keys on either side of it (the same filter)."""

    keys: list[KeyRecord]
    earlier: bool
    later: bool


@dataclass(frozen=True, slots=True)
class KeyFilter:
    """Which keys a page lists: of one kind, one project's, with a word that starts with ``search``, in a state.

    A key's words are its id, its prefix, its name and each word of its name (:func:`search_terms`), matched
    without regard to case: the start of a word is one range of an index, however many keys there are.
    """

    kind: KeyKind
    project_id: str | None = None
    search: str = ""
    state: str = ""
    user_id: str | None = None
    """One person's keys only (the members' portal lists a person's own)."""


__all__ = [
    "KEY_STATES",
    "KeyFilter",
    "KeyKind",
    "KeyPage",
    "KeyRecord",
    "KeysRepo",
    "hash_secret",
    "new_key_id",
    "search_terms",
]
"""``hash_secret`` and ``new_key_id`` are :mod:`opod.security.keys`' own, named here for the store's callers."""


_LAST_CHARACTER = "\U0010ffff"
_FEW_TERMS = 2000


def search_terms(key_id: str, name: str, prefix: str) -> set[str]:
    """What a key listing's search matches the start of: the id, the prefix, the name and each word of it, in
    lower case."""
    words = {key_id.lower(), prefix.lower(), name.lower(), *name.lower().split()}
    return {w for w in words if w}


def _insert(conn: Connection, record: KeyRecord) -> None:
    conn.execute(keys.insert().values(**asdict(record)))
    terms = search_terms(record.id, record.name, record.prefix)
    conn.execute(key_terms.insert(), [{"term": t, "key_id": record.id} for t in sorted(terms)])


def _record(row: Row[Any]) -> KeyRecord:
    return KeyRecord(**row._mapping)


def _kind(value: object) -> KeyKind:
    if value not in KEY_KINDS:
        raise InvalidInput(f"key kind {value!r} is not one of {', '.join(KEY_KINDS)}")
    return cast(KeyKind, value)


def _hash(value: object) -> str:
    if not isinstance(value, str) or not _HASH.match(value.lower()):
        raise InvalidInput("a key hash is 64 hex digits (the SHA-256 of the secret; see hash_secret)")
    return value.lower()


def _refuse_duplicate(conn: Connection, record: KeyRecord) -> None:
    if conn.execute(select(keys.c.id).where(keys.c.id == record.id)).first() is not None:
        raise Conflict(f"a key with id {record.id!r} already exists; choose another id")
    other = conn.execute(select(keys.c.id).where(keys.c.hash == record.hash)).scalar()
    if other is not None:
        raise Conflict(f"key {other!r} already has this hash, so the secret is not new; generate a new key")


def _starting(search: str) -> Any:
    """The terms that start with ``search``: one range of their index, since terms sort by code point on both
    databases."""
    start = search.strip().lower()
    return and_(key_terms.c.term >= start, key_terms.c.term < start + _LAST_CHARACTER)


def _searched(conn: Connection, search: str) -> Any:
    """A page's keys with a term that starts with ``search``: taken from the terms when few match, else checked key
    by key as the keys are read in id order (the page stops after its rows)."""
    few = select(key_terms.c.key_id).where(_starting(search)).limit(_FEW_TERMS + 1).subquery()
    if int(conn.execute(select(func.count()).select_from(few)).scalar() or 0) <= _FEW_TERMS:
        return keys.c.id.in_(select(key_terms.c.key_id).where(_starting(search)))
    return exists().where(key_terms.c.key_id == keys.c.id, _starting(search))


def _conditions(which: KeyFilter) -> list[Any]:
    """The filter's conditions on the keys, but for its search (which :meth:`KeysRepo.page_keys` and
    :meth:`KeysRepo.count_keys` each apply their own way)."""
    now = datetime.now(UTC)
    out: list[Any] = [keys.c.kind == _kind(which.kind)]
    if which.project_id is not None:
        out.append(keys.c.project_id == which.project_id)
    if which.user_id is not None:
        out.append(keys.c.user_id == which.user_id)
    if which.state == "revoked":
        out.append(keys.c.revoked_at.is_not(None))
    elif which.state == "expired":
        out.append(and_(keys.c.revoked_at.is_(None), keys.c.expires_at.is_not(None), keys.c.expires_at <= now))
    elif which.state == "active":
        out.append(and_(keys.c.revoked_at.is_(None), or_(keys.c.expires_at.is_(None), keys.c.expires_at > now)))
    elif which.state:
        raise InvalidInput(f"state: {which.state!r} is not one of {', '.join(KEY_STATES)}")
    return out


class KeysRepo(CommitsRepo):
    def create_key(
        self,
        *,
        kind: KeyKind,
        name: str,
        hash: str,
        prefix: str,
        team: str = "",
        admission_class: str = "",
        expires_at: datetime | None = None,
        node_id: str | None = None,
        id: str | None = None,
        created_at: datetime | None = None,
        project_id: str = "",
        user_id: str = "",
        routing_profile: str = "",
        leader_id: str = "",
        audit: AuditRow | None = None,
    ) -> KeyRecord:
        """Store a new key by its hash. ``id`` defaults to a fresh one for its kind; ``node_id`` only for node tokens."""
        record = KeyRecord(
            id=text_arg(id, "key id") if id is not None else new_key_id(_kind(kind)),
            kind=_kind(kind),
            name=text_arg(name, "key name", empty=True),
            hash=_hash(hash),
            prefix=text_arg(prefix, "key prefix", empty=True),
            team=text_arg(team, "team", empty=True),
            admission_class=text_arg(admission_class, "admission class", empty=True),
            created_at=when(created_at, "created_at"),
            expires_at=aware(expires_at, "expires_at") if expires_at is not None else None,
            revoked_at=None,
            last_used_at=None,
            node_id=text_arg(node_id, "node id") if node_id is not None else None,
            project_id=text_arg(project_id, "project", empty=True),
            user_id=text_arg(user_id, "user", empty=True),
            routing_profile=text_arg(routing_profile, "routing_profile", empty=True),
            leader_id=text_arg(leader_id, "leader id", empty=True),
        )
        if len(record.prefix) > PREFIX_MAX:
            raise InvalidInput(
                f"key prefix is {len(record.prefix)} characters; keep at most {PREFIX_MAX}, never the whole key"
            )
        if record.node_id is not None and record.kind != "node":
            raise InvalidInput(f"only node tokens are bound to a node; this key is kind {record.kind!r}")
        if record.leader_id and record.kind != "admin":
            raise InvalidInput(f"only admin keys belong to a leader; this key is kind {record.kind!r}")
        if record.expires_at is not None and record.expires_at <= record.created_at:
            raise InvalidInput(
                f"expires_at {record.expires_at.isoformat()} is not after created_at {record.created_at.isoformat()}"
            )
        try:
            with self._write() as conn:
                _refuse_duplicate(conn, record)
                if record.project_id:
                    # The project keeps, for good, that it had a key: usage refers to it, so it is only renamed.
                    marked = conn.execute(
                        update(projects).where(projects.c.id == record.project_id).values(had_key=True)
                    ).rowcount
                    if not marked:
                        raise NotFound(
                            f"project: no project with ID {record.project_id!r}; GET /api/v1/orgs lists them"
                        )
                _insert(conn, record)
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:
            # Another writer inserted the same id or hash between the check and the insert.
            raise Conflict(f"key {record.id!r} or its hash already exists; generate a new key") from err
        return record

    def get_key(self, id: str) -> KeyRecord:
        with self._read() as conn:
            row = conn.execute(select(keys).where(keys.c.id == id)).first()
        if row is None:
            raise NotFound(f"key {id!r} does not exist; list the keys to find its id")
        return _record(row)

    def key_by_hash(self, hash: str) -> KeyRecord | None:
        """The key whose secret hashes to ``hash``, or None (an unknown key is no error, just refused)."""
        digest = _hash(hash)
        with self._read() as conn:
            row = conn.execute(select(keys).where(keys.c.hash == digest)).first()
        return None if row is None else _record(row)

    def list_keys(self, kind: KeyKind | None = None, *, project_id: str | None = None) -> list[KeyRecord]:
        """Every key, oldest first; only one kind when ``kind`` is given, one project's when ``project_id`` is."""
        query = select(keys).order_by(keys.c.created_at, keys.c.id)
        if kind is not None:
            query = query.where(keys.c.kind == _kind(kind))
        if project_id is not None:
            query = query.where(keys.c.project_id == project_id)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def page_keys(self, which: KeyFilter, *, after: str = "", before: str = "", limit: int = 50) -> KeyPage:
        """At most ``limit`` keys in id order, after the id ``after`` or before the id ``before`` (keyset paging on the
        primary key's index: a page costs the same at any depth, however many keys there are)."""
        if not 1 <= limit <= PAGE_MAX:
            raise InvalidInput(f"limit: {limit} is outside 1..{PAGE_MAX}")
        with self._read() as conn:
            query = select(keys).where(*_conditions(which)).limit(limit + 1)
            if which.search.strip():
                query = query.where(_searched(conn, which.search))
            if before:
                query = query.where(keys.c.id < before).order_by(keys.c.id.desc())
            else:
                query = query.where(keys.c.id > after).order_by(keys.c.id) if after else query.order_by(keys.c.id)
            found = [_record(row) for row in conn.execute(query)]
        more = len(found) > limit
        found = found[:limit]
        if before:
            return KeyPage(list(reversed(found)), earlier=more, later=True)
        return KeyPage(found, earlier=bool(after), later=more)

    def count_keys(self, which: KeyFilter, *, at_most: int = COUNT_MAX) -> int:
        """How many keys ``which`` lists, counted up to ``at_most`` (a count past it is said as "more than")."""
        matching = select(keys.c.id).where(*_conditions(which))
        if which.search.strip():
            # From the terms that match, each key once: as cheap for a word that starts a tenth of the keys as for one.
            found = key_terms.join(keys, keys.c.id == key_terms.c.key_id)
            matching = matching.select_from(found).where(_starting(which.search)).distinct()
        capped = matching.limit(at_most + 1).subquery()
        with self._read() as conn:
            return int(conn.execute(select(func.count()).select_from(capped)).scalar() or 0)

    def keys_changed_since(self, since: datetime | None, kinds: Collection[str] = KEY_KINDS) -> list[KeyRecord]:
        """The keys of ``kinds`` created or revoked at ``since`` or later (every one when None), oldest first: what a
        leader reads to follow the keys other leaders of the same store mint and revoke."""
        query = select(keys).where(keys.c.kind.in_([_kind(k) for k in kinds])).order_by(keys.c.created_at, keys.c.id)
        if since is not None:
            stamp = aware(since, "since")
            query = query.where(or_(keys.c.created_at >= stamp, keys.c.revoked_at >= stamp))
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def replace_admin_key(
        self, leader_id: str, *, hash: str, prefix: str, name: str = "admin", at: datetime | None = None
    ) -> tuple[KeyRecord, list[KeyRecord]]:
        """Store a new admin key for ``leader_id`` and revoke its active ones, in one transaction; returns the new key
        and those revoked.

        Revoked are the leader's own and those that name no leader (stored before admin keys named theirs, and
        never claimed by a leader whose home holds them); another leader's admin key is never touched, so leaders
        sharing one store each keep theirs.
        """
        owner = text_arg(leader_id, "leader id")
        stamp = when(at, "revoked_at")
        stale = select(keys).where(
            keys.c.kind == "admin", keys.c.revoked_at.is_(None), keys.c.leader_id.in_([owner, ""])
        )
        record = KeyRecord(
            id=new_key_id("admin"),
            kind="admin",
            name=text_arg(name, "key name", empty=True),
            hash=_hash(hash),
            prefix=text_arg(prefix, "key prefix", empty=True),
            team="",
            admission_class="",
            created_at=stamp,
            expires_at=None,
            revoked_at=None,
            last_used_at=None,
            node_id=None,
            leader_id=owner,
        )
        if len(record.prefix) > PREFIX_MAX:
            raise InvalidInput(
                f"key prefix is {len(record.prefix)} characters; keep at most {PREFIX_MAX}, never the whole key"
            )
        try:
            with self._write() as conn:
                _refuse_duplicate(conn, record)
                found = [_record(r) for r in conn.execute(stale)]
                if found:
                    conn.execute(
                        update(keys)
                        .where(keys.c.id.in_([k.id for k in found]), keys.c.revoked_at.is_(None))
                        .values(revoked_at=stamp)
                    )
                _insert(conn, record)
        except IntegrityError as err:
            raise Conflict(f"key {record.id!r} or its hash already exists; generate a new key") from err
        return record, [KeyRecord(**{**asdict(k), "revoked_at": stamp}) for k in found]

    def claim_admin_key(self, id: str, leader_id: str) -> KeyRecord:
        """Record that ``leader_id``'s home holds admin key ``id`` (a key stored before admin keys named their
        leader, or one whose leader's name changed); returns it as stored now."""
        owner = text_arg(leader_id, "leader id")
        with self._write() as conn:
            conn.execute(update(keys).where(keys.c.id == id, keys.c.kind == "admin").values(leader_id=owner))
            row = conn.execute(select(keys).where(keys.c.id == id)).first()
        if row is None or row.kind != "admin":
            raise NotFound(f"admin key {id!r} does not exist; list the admin keys to find its id")
        return _record(row)

    def revoke_key(self, id: str, at: datetime | None = None, *, audit: AuditRow | None = None) -> KeyRecord:
        """Revoke a key. Revoking it again changes nothing and keeps the first revocation time."""
        stamp = when(at, "revoked_at")
        with self._write() as conn:
            conn.execute(update(keys).where(keys.c.id == id, keys.c.revoked_at.is_(None)).values(revoked_at=stamp))
            row = conn.execute(select(keys).where(keys.c.id == id)).first()
            if row is None:
                raise NotFound(f"key {id!r} does not exist, so it cannot be revoked; list the keys to find its id")
            if audit is not None:
                insert_audit(conn, audit)
        return _record(row)

    def revoke_user_keys(
        self,
        user_id: str,
        project_ids: Collection[str] | None = None,
        at: datetime | None = None,
        *,
        audit: AuditRow | None = None,
    ) -> list[KeyRecord]:
        """Revoke a person's active keys, in ``project_ids`` only when given (``""`` names their own keys); returns those revoked."""
        stamp = when(at, "revoked_at")
        query = select(keys).where(keys.c.user_id == text_arg(user_id, "user"), keys.c.revoked_at.is_(None))
        if project_ids is not None:
            query = query.where(keys.c.project_id.in_(sorted(set(project_ids))))
        with self._write() as conn:
            found = [_record(r) for r in conn.execute(query)]
            if found:
                conn.execute(update(keys).where(keys.c.id.in_([k.id for k in found])).values(revoked_at=stamp))
            if audit is not None:
                insert_audit(conn, audit)
        return [KeyRecord(**{**asdict(k), "revoked_at": stamp}) for k in found]

    def mark_keys_used(self, ids: Collection[str], at: datetime | None = None) -> int:
        """Record that these keys were used by ``at``, in one transaction; returns how many moved.

        The leader collects the keys it authenticated and calls this every few seconds, so
        the request path never waits on the store. Times only move forward, so a late batch
        is harmless; an id that is not stored (a key from the auth file, a key deleted since)
        is skipped.
        """
        return self._move_forward(keys.c.last_used_at, ids, at, "key id", "keys' last use")
