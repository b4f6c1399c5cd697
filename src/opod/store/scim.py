"""What SCIM provisioning keeps beside the people: ``scim_users``, ``scim_groups`` and ``scim_group_members``.

A provisioned person is a row of ``users`` (their email, name, state) and one of ``scim_users``: the
``userName`` the provider gave (any text, unique in any case) and the resource as it was last written,
so what the provider reads back is what it wrote. A group is the provider's own (any name, unique in
any case), with its members. The memberships a group grants (the rule of
:class:`opod.access.group_rules.GroupRules`, handed down as :class:`GroupGrants`) are made and taken
back here, in the transaction that changes the group, by the one step :func:`opod.store.people.match_in`:
a membership SCIM made is ``by`` :data:`SCIM_BY`; one an operator made is never touched. Every change
takes ``audit``, written in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import BigInteger, Column, Connection, ForeignKey, Row, Table, Text, UniqueConstraint, delete, select
from sqlalchemy import update as sql_update
from sqlalchemy.exc import IntegrityError

from opod.security.keys import new_secret
from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.people import MembershipsMatched, UserRecord, match_in
from opod.store.schema import USER_STATES, UTCDateTime, memberships, metadata, users

SCIM_BY = "scim"
"""The ``by`` of a membership a SCIM group granted: the only ones a group change takes back."""
GROUP_PREFIX = "grp_"

# 0017: SCIM's own view of people and groups.
scim_users = Table(
    "scim_users",
    metadata,
    Column("user_id", Text, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    Column("user_name", Text, nullable=False),
    Column("user_name_folded", Text, nullable=False),  # unique: userName is case-insensitive (RFC 7643 4.1.1)
    Column("document", Text, nullable=False),  # the resource as the provider last wrote it, as JSON
    Column("version", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("user_name_folded"),
)

scim_groups = Table(
    "scim_groups",
    metadata,
    Column("id", Text, primary_key=True),
    Column("display_name", Text, nullable=False),
    Column("display_name_folded", Text, nullable=False),  # unique: the settings map a group by its name
    Column("external_id", Text, nullable=False),
    Column("document", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("display_name_folded"),
)

scim_group_members = Table(
    "scim_group_members",
    metadata,
    Column("group_id", Text, ForeignKey("scim_groups.id", ondelete="CASCADE"), primary_key=True),
    Column("user_id", Text, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True),
    Column("display", Text, nullable=False),  # the name the provider shows the member by, as it sent it
)


@dataclass(frozen=True, slots=True)
class ScimUserRecord:
    user_id: str
    user_name: str
    document: dict[str, Any]
    version: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScimGroupRecord:
    id: str
    display_name: str
    external_id: str
    document: dict[str, Any]
    members: tuple[tuple[str, str], ...]
    """(user id, display as the provider sent it) pairs, by user id."""
    version: int
    created_at: datetime
    updated_at: datetime


class GroupGrants(Protocol):
    """What groups grant, by their names: the rule the caller holds (``auth.scim_groups`` read), applied here in the
    transaction that changes the groups."""

    @property
    def targets(self) -> frozenset[str]:
        """Every org, team or project id the groups grant."""
        ...

    def places(self, groups: Iterable[str]) -> dict[str, str]:
        """Target id → role that membership of ``groups`` (by display name) grants."""
        ...


def new_group_id() -> str:
    return new_secret(GROUP_PREFIX, 20)


def _folded(text: str) -> str:
    return text.strip().lower()


def _scim_user(row: Row[Any]) -> ScimUserRecord:
    return ScimUserRecord(row.user_id, row.user_name, json.loads(row.document), int(row.version), row.updated_at)


def _scim_group(row: Row[Any], members: Collection[tuple[str, str]]) -> ScimGroupRecord:
    return ScimGroupRecord(
        row.id,
        row.display_name,
        row.external_id,
        json.loads(row.document),
        tuple(members),
        int(row.version),
        row.created_at,
        row.updated_at,
    )


def _person(conn: Connection, user_id: str) -> UserRecord:
    row = conn.execute(select(users).where(users.c.id == user_id)).first()
    if row is None:
        raise NotFound(f"no person {user_id!r}; GET /scim/v2/Users lists them")
    values = dict(row._mapping)
    return UserRecord(**{name: values[name] for name in UserRecord.__dataclass_fields__})


class ScimRepo(Repository):
    # --- people --------------------------------------------------------------------------------

    def scim_users(self) -> list[ScimUserRecord]:
        """Everyone SCIM provisioned, oldest person first."""
        query = (
            select(scim_users).join(users, users.c.id == scim_users.c.user_id).order_by(users.c.created_at, users.c.id)
        )
        with self._read() as conn:
            return [_scim_user(r) for r in conn.execute(query)]

    def scim_user(self, user_id: str) -> ScimUserRecord | None:
        with self._read() as conn:
            row = conn.execute(select(scim_users).where(scim_users.c.user_id == user_id)).first()
        return None if row is None else _scim_user(row)

    def scim_user_by_name(self, user_name: str) -> ScimUserRecord | None:
        with self._read() as conn:
            row = conn.execute(select(scim_users).where(scim_users.c.user_name_folded == _folded(user_name))).first()
        return None if row is None else _scim_user(row)

    def provision_user(
        self,
        *,
        user_id: str,
        user_name: str,
        email: str,
        name: str,
        state: str,
        external_id: str,
        document: Mapping[str, Any],
        create: bool,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> tuple[UserRecord, ScimUserRecord]:
        """Write a provisioned person and their resource in one transaction. With ``create``, a person SCIM never
        provisioned who holds ``email`` is taken over (their id, memberships and keys kept); else ``user_id`` is
        new. Without it, ``user_id`` must be provisioned. Conflict when the userName or email is someone else's."""
        stamp = when(at, "updated_at")
        user_name = text_arg(user_name, "userName").strip()
        email = text_arg(email, "email").strip()
        if state not in USER_STATES:
            raise InvalidInput(f"state {state!r} is not one of {', '.join(USER_STATES)}")
        values = {
            "email": email,
            "email_folded": email.lower(),
            "name": text_arg(name, "name", empty=True),
            "state": state,
            "external_id": text_arg(external_id, "externalId", empty=True),
        }
        try:
            with self._write() as conn:
                holder = conn.execute(select(users.c.id).where(users.c.email_folded == email.lower())).scalar()
                if create and holder is not None:
                    linked = conn.execute(select(scim_users.c.user_id).where(scim_users.c.user_id == holder)).first()
                    if linked is not None:
                        raise Conflict(f"email {email!r} is provisioned person {holder}'s already; change them instead")
                    user_id = holder
                elif holder is not None and holder != user_id:
                    raise Conflict(f"email {email!r} is person {holder}'s already")
                named = conn.execute(
                    select(scim_users.c.user_id).where(scim_users.c.user_name_folded == _folded(user_name))
                ).scalar()
                if named is not None and named != user_id:
                    raise Conflict(f"userName {user_name!r} is person {named}'s already")
                current = conn.execute(select(scim_users.c.version).where(scim_users.c.user_id == user_id)).scalar()
                if not create and current is None:
                    raise NotFound(f"no User {user_id!r}; GET /scim/v2/Users lists them")
                if create and holder is None:
                    conn.execute(
                        users.insert().values(id=user_id, role="", created_at=stamp, last_login_at=None, **values)
                    )
                else:
                    conn.execute(sql_update(users).where(users.c.id == user_id).values(**values))
                version = int(current or 0) + 1
                kept = {
                    "user_name": user_name,
                    "user_name_folded": _folded(user_name),
                    "document": json.dumps(dict(document), default=str),
                    "version": version,
                    "updated_at": stamp,
                }
                if current is None:
                    conn.execute(scim_users.insert().values(user_id=user_id, **kept))
                else:
                    conn.execute(sql_update(scim_users).where(scim_users.c.user_id == user_id).values(**kept))
                if audit is not None:
                    insert_audit(conn, audit)
                person = _person(conn, user_id)
        except IntegrityError as err:  # another writer took the email or the userName between the check and now
            raise Conflict(f"email {email!r} or userName {user_name!r} was taken meanwhile; retry") from err
        return person, ScimUserRecord(user_id, user_name, dict(document), version, stamp)

    def unprovision_user(
        self,
        user_id: str,
        *,
        grants: GroupGrants,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> tuple[UserRecord, MembershipsMatched]:
        """SCIM's DELETE: the person is disabled (their record kept for the audit), leaves SCIM's view and every group,
        and loses what those groups granted, with the keys that reached nowhere else."""
        stamp = when(at, "updated_at")
        with self._write() as conn:
            gone = conn.execute(delete(scim_users).where(scim_users.c.user_id == user_id)).rowcount
            if not gone:
                raise NotFound(f"no User {user_id!r}; GET /scim/v2/Users lists them")
            conn.execute(sql_update(users).where(users.c.id == user_id).values(state="disabled"))
            names = _group_names(conn, user_id)
            conn.execute(delete(scim_group_members).where(scim_group_members.c.user_id == user_id))
            change = _sync(conn, grants, grants.places(names).keys(), stamp)
            if audit is not None:
                insert_audit(conn, audit)
            return _person(conn, user_id), change

    # --- groups --------------------------------------------------------------------------------

    def scim_groups(self) -> list[ScimGroupRecord]:
        """Every group, oldest first, with its members."""
        with self._read() as conn:
            held = _members(conn, None)
            rows = conn.execute(select(scim_groups).order_by(scim_groups.c.created_at, scim_groups.c.id)).all()
        return [_scim_group(r, held.get(r.id, [])) for r in rows]

    def scim_group(self, group_id: str) -> ScimGroupRecord | None:
        with self._read() as conn:
            row = conn.execute(select(scim_groups).where(scim_groups.c.id == group_id)).first()
            return None if row is None else _scim_group(row, _members(conn, group_id).get(group_id, []))

    def scim_groups_of(self, user_id: str) -> list[ScimGroupRecord]:
        """The groups ``user_id`` is a member of (without their members)."""
        query = (
            select(scim_groups)
            .join(scim_group_members, scim_group_members.c.group_id == scim_groups.c.id)
            .where(scim_group_members.c.user_id == user_id)
            .order_by(scim_groups.c.display_name_folded)
        )
        with self._read() as conn:
            return [_scim_group(r, ()) for r in conn.execute(query)]

    def put_scim_group(
        self,
        group_id: str,
        *,
        display_name: str,
        external_id: str,
        document: Mapping[str, Any],
        members: Mapping[str, str],
        create: bool,
        grants: GroupGrants,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> tuple[ScimGroupRecord, MembershipsMatched]:
        """Create or replace a group whole (its name, ``members`` as user id → display, its resource), and in the same transaction make and take
        back what it grants under its old and its new name. Conflict for a name another group has; NotFound for a
        member SCIM did not provision."""
        stamp = when(at, "updated_at")
        display_name = text_arg(display_name, "displayName").strip()
        wanted = list(members)
        try:
            with self._write() as conn:
                row = conn.execute(select(scim_groups).where(scim_groups.c.id == group_id)).first()
                if create and row is not None:
                    raise Conflict(f"a group with id {group_id!r} exists already")
                if not create and row is None:
                    raise NotFound(f"no Group {group_id!r}; GET /scim/v2/Groups lists them")
                named = conn.execute(
                    select(scim_groups.c.id).where(scim_groups.c.display_name_folded == _folded(display_name))
                ).scalar()
                if named is not None and named != group_id:
                    raise Conflict(f"displayName {display_name!r} is group {named}'s already")
                provisioned = set(
                    conn.execute(select(scim_users.c.user_id).where(scim_users.c.user_id.in_(wanted))).scalars()
                )
                unknown = [u for u in wanted if u not in provisioned]
                if unknown:
                    raise NotFound(
                        f"members: no User {', '.join(repr(u) for u in unknown)}; provision them through /Users first"
                    )
                kept = {
                    "display_name": display_name,
                    "display_name_folded": _folded(display_name),
                    "external_id": text_arg(external_id, "externalId", empty=True),
                    "document": json.dumps(dict(document), default=str),
                    "version": (int(row.version) if row is not None else 0) + 1,
                    "updated_at": stamp,
                }
                if row is None:
                    conn.execute(scim_groups.insert().values(id=group_id, created_at=stamp, **kept))
                else:
                    conn.execute(sql_update(scim_groups).where(scim_groups.c.id == group_id).values(**kept))
                present = dict(_members(conn, group_id).get(group_id, []))
                leaving = [u for u in present if u not in members]
                if leaving:
                    conn.execute(
                        delete(scim_group_members).where(
                            scim_group_members.c.group_id == group_id, scim_group_members.c.user_id.in_(leaving)
                        )
                    )
                arriving = [u for u in wanted if u not in present]
                if arriving:
                    conn.execute(
                        scim_group_members.insert(),
                        [{"group_id": group_id, "user_id": u, "display": members[u]} for u in arriving],
                    )
                for user_id in wanted:
                    if user_id in present and present[user_id] != members[user_id]:
                        conn.execute(
                            sql_update(scim_group_members)
                            .where(scim_group_members.c.group_id == group_id, scim_group_members.c.user_id == user_id)
                            .values(display=members[user_id])
                        )
                names = [display_name] + ([row.display_name] if row is not None else [])
                change = _sync(conn, grants, {t for n in names for t in grants.places([n])}, stamp)
                if audit is not None:
                    insert_audit(conn, audit)
                saved = conn.execute(select(scim_groups).where(scim_groups.c.id == group_id)).one()
                return _scim_group(saved, _members(conn, group_id).get(group_id, [])), change
        except IntegrityError as err:
            raise Conflict(f"displayName {display_name!r} or id {group_id!r} was taken meanwhile; retry") from err

    def delete_scim_group(
        self,
        group_id: str,
        *,
        grants: GroupGrants,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> MembershipsMatched:
        """Delete a group, and take back what it granted, with the keys that reached nowhere else."""
        stamp = when(at, "updated_at")
        with self._write() as conn:
            row = conn.execute(select(scim_groups).where(scim_groups.c.id == group_id)).first()
            if row is None:
                raise NotFound(f"no Group {group_id!r}; GET /scim/v2/Groups lists them")
            conn.execute(delete(scim_group_members).where(scim_group_members.c.group_id == group_id))
            conn.execute(delete(scim_groups).where(scim_groups.c.id == group_id))
            change = _sync(conn, grants, grants.places([row.display_name]).keys(), stamp)
            if audit is not None:
                insert_audit(conn, audit)
        return change

    def sync_scim_grants(
        self, grants: GroupGrants, *, at: datetime | None = None, audit: AuditRow | None = None
    ) -> MembershipsMatched:
        """Bring every membership SCIM grants in line with ``grants`` (after the mapping changed): the targets it names
        and those holding a membership SCIM made. ``audit`` is written only when something changed."""
        stamp = when(at, "at")
        with self._write() as conn:
            made = set(conn.execute(select(memberships.c.target).where(memberships.c.by == SCIM_BY)).scalars())
            change = _sync(conn, grants, made | grants.targets, stamp)
            if audit is not None and (change.added or change.removed):
                insert_audit(conn, audit)
        return change


def _members(conn: Connection, group_id: str | None) -> dict[str, list[tuple[str, str]]]:
    query = select(scim_group_members.c.group_id, scim_group_members.c.user_id, scim_group_members.c.display).order_by(
        scim_group_members.c.group_id, scim_group_members.c.user_id
    )
    if group_id is not None:
        query = query.where(scim_group_members.c.group_id == group_id)
    held: dict[str, list[tuple[str, str]]] = {}
    for group, user, display in conn.execute(query):
        held.setdefault(group, []).append((user, display))
    return held


def _group_names(conn: Connection, user_id: str) -> list[str]:
    query = (
        select(scim_groups.c.display_name)
        .join(scim_group_members, scim_group_members.c.group_id == scim_groups.c.id)
        .where(scim_group_members.c.user_id == user_id)
    )
    return list(conn.execute(query).scalars())


def _sync(conn: Connection, grants: GroupGrants, targets: Collection[str], stamp: datetime) -> MembershipsMatched:
    """On ``conn``: in each of ``targets``, the memberships SCIM made brought in line with what each member's groups
    grant there (:func:`match_in`, owner :data:`SCIM_BY`)."""
    if not targets:
        return MembershipsMatched()
    groups_of: dict[str, list[str]] = {}
    rows = conn.execute(
        select(scim_group_members.c.user_id, scim_groups.c.display_name).join(
            scim_groups, scim_groups.c.id == scim_group_members.c.group_id
        )
    )
    for user_id, name in rows:
        groups_of.setdefault(user_id, []).append(name)
    wanted = {
        (user_id, target): role
        for user_id, names in groups_of.items()
        for target, role in grants.places(names).items()
        if target in targets
    }
    return match_in(conn, wanted, targets=targets, users=None, owner=SCIM_BY, by=SCIM_BY, stamp=stamp)


__all__ = [
    "GROUP_PREFIX",
    "SCIM_BY",
    "GroupGrants",
    "ScimGroupRecord",
    "ScimRepo",
    "ScimUserRecord",
    "new_group_id",
]
