"""People and where each belongs: ``users`` and ``memberships``.

People arrive through SCIM provisioning (and, later, sign-in); the management API changes their
memberships. Every change takes ``audit``, written in the same transaction as the change; taking
people out of a place (:meth:`PeopleRepo.leave`, :func:`match_in`) revokes their keys in the projects
they no longer reach in that transaction too. :func:`match_in` is the one step that brings a slice of
the memberships in line with what is wanted there: a provider's groups at sign-in (OIDC, LDAP) and
SCIM's groups alike.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, delete, func, select, update
from sqlalchemy.exc import IntegrityError

from opod.security.keys import new_secret
from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.keys import KeyRecord
from opod.store.schema import (
    MEMBER_ROLES,
    USER_ROLES,
    USER_STATES,
    credentials,
    keys,
    memberships,
    projects,
    teams,
    users,
)

USER_PREFIX = "usr_"


@dataclass(frozen=True, slots=True)
class UserRecord:
    id: str
    email: str
    name: str
    state: str
    """pending, active or disabled."""
    role: str
    """viewer, operator, billing, admin, or empty: the person only uses the fleet."""
    external_id: str
    """The identity provider's own id for the person (SCIM ``externalId``); empty when none sent it."""
    created_at: datetime
    last_login_at: datetime | None


@dataclass(frozen=True, slots=True)
class MembershipRecord:
    user_id: str
    target: str
    """The id of an org, team or project."""
    role: str
    """member or manager."""
    at: datetime
    by: str


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """What one membership change did, in its one transaction."""

    added: list[str]
    removed: list[str]
    """The people who left."""
    revoked: list[KeyRecord]
    """The keys of those who left, in projects no membership of theirs reaches any more: revoked with the change."""


@dataclass(frozen=True, slots=True)
class MembershipsMatched:
    """What one :func:`match_in` changed: memberships made or given another role, those taken out, and the keys
    revoked with them."""

    added: list[tuple[str, str]] = field(default_factory=list)
    """(user id, target id) pairs made, or whose role changed."""
    removed: list[tuple[str, str]] = field(default_factory=list)
    revoked: list[KeyRecord] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.added + self.removed})


Pair = tuple[str, str]
"""(user id, target id): one membership."""


def new_user_id() -> str:
    return new_secret(USER_PREFIX, 20)


def _one_of(value: str, allowed: Sequence[str], field: str) -> str:
    if value not in allowed:
        shown = ", ".join(a for a in allowed if a) + (" (or empty for none)" if "" in allowed else "")
        raise InvalidInput(f"{field} {value!r} is not one of {shown}")
    return value


def _email(value: str) -> str:
    email = text_arg(value, "email").strip()
    if any(c.isspace() for c in email):
        raise InvalidInput(f"email {value!r} contains a space; send the address alone")
    return email


def _user(row: Row[Any]) -> UserRecord:
    values = dict(row._mapping)
    values.pop("email_folded")
    return UserRecord(**values)


def _membership(row: Row[Any]) -> MembershipRecord:
    return MembershipRecord(**row._mapping)


def _email_taken(conn: Connection, email: str, other_than: str | None = None) -> None:
    query = select(users.c.id).where(users.c.email_folded == email.lower())
    if other_than is not None:
        query = query.where(users.c.id != other_than)
    holder = conn.execute(query).scalar()
    if holder is not None:
        raise Conflict(f"email {email!r} already belongs to person {holder}; change that person instead")


class PeopleRepo(Repository):
    # --- people ------------------------------------------------------------------------------

    def create_user(
        self,
        *,
        email: str,
        name: str = "",
        state: str = "active",
        role: str = "",
        external_id: str = "",
        id: str | None = None,
        created_at: datetime | None = None,
        password_hash: str = "",
        audit: AuditRow | None = None,
    ) -> UserRecord:
        """A new person (with a local password when ``password_hash`` is given); Conflict when the email (in any
        case) is someone's already."""
        record = UserRecord(
            id=text_arg(id, "user id") if id is not None else new_user_id(),
            email=_email(email),
            name=text_arg(name, "name", empty=True),
            state=_one_of(state, USER_STATES, "state"),
            role=_one_of(role, USER_ROLES, "role"),
            external_id=text_arg(external_id, "external id", empty=True),
            created_at=when(created_at, "created_at"),
            last_login_at=None,
        )
        try:
            with self._write() as conn:
                _email_taken(conn, record.email)
                if conn.execute(select(users.c.id).where(users.c.id == record.id)).first() is not None:
                    raise Conflict(f"a person with id {record.id!r} already exists")
                conn.execute(users.insert().values(**asdict(record), email_folded=record.email.lower()))
                if password_hash:
                    conn.execute(
                        credentials.insert().values(user_id=record.id, hash=password_hash, updated_at=record.created_at)
                    )
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:  # another writer took the email between the check and the insert
            raise Conflict(f"email {record.email!r} or id {record.id!r} is taken already") from err
        return record

    def update_user(
        self,
        id: str,
        *,
        email: str | None = None,
        name: str | None = None,
        state: str | None = None,
        role: str | None = None,
        external_id: str | None = None,
        last_login_at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> UserRecord:
        """Change the fields given; NotFound for an unknown id, Conflict for an email someone else has."""
        changes: dict[str, Any] = {}
        if email is not None:
            changes["email"] = _email(email)
            changes["email_folded"] = changes["email"].lower()
        if name is not None:
            changes["name"] = text_arg(name, "name", empty=True)
        if state is not None:
            changes["state"] = _one_of(state, USER_STATES, "state")
        if role is not None:
            changes["role"] = _one_of(role, USER_ROLES, "role")
        if external_id is not None:
            changes["external_id"] = text_arg(external_id, "external id", empty=True)
        if last_login_at is not None:
            changes["last_login_at"] = when(last_login_at, "last_login_at")
        try:
            with self._write() as conn:
                row = conn.execute(select(users).where(users.c.id == id)).first()
                if row is None:
                    raise NotFound(f"no person {id!r}; GET /api/v1/users lists them")
                if "email" in changes:
                    _email_taken(conn, changes["email"], other_than=id)
                if changes:
                    conn.execute(update(users).where(users.c.id == id).values(**changes))
                if audit is not None:
                    insert_audit(conn, audit)
                changes.pop("email_folded", None)
                return replace(_user(row), **changes)
        except IntegrityError as err:
            raise Conflict(f"email {email!r} is someone else's already") from err

    def get_user(self, id: str) -> UserRecord:
        with self._read() as conn:
            row = conn.execute(select(users).where(users.c.id == id)).first()
        if row is None:
            raise NotFound(f"no person {id!r}; GET /api/v1/users lists them")
        return _user(row)

    def user_by_email(self, email: str) -> UserRecord | None:
        """The person with this email, whatever its case; None when nobody has it."""
        with self._read() as conn:
            row = conn.execute(select(users).where(users.c.email_folded == email.strip().lower())).first()
        return None if row is None else _user(row)

    def list_users(self, state: str | None = None) -> list[UserRecord]:
        """Everyone, oldest first; only those in ``state`` when given."""
        query = select(users).order_by(users.c.created_at, users.c.id)
        if state is not None:
            query = query.where(users.c.state == _one_of(state, USER_STATES, "state"))
        with self._read() as conn:
            return [_user(r) for r in conn.execute(query)]

    def count_users(self) -> int:
        with self._read() as conn:
            return int(conn.execute(select(func.count()).select_from(users)).scalar_one())

    # --- memberships -------------------------------------------------------------------------

    def set_membership(
        self,
        user_id: str,
        target: str,
        *,
        role: str = "member",
        by: str = "",
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> MembershipRecord:
        """Put a person in ``target`` (an org, team or project id), or change their role there."""
        record = MembershipRecord(
            user_id=text_arg(user_id, "user id"),
            target=text_arg(target, "target"),
            role=_one_of(role, MEMBER_ROLES, "role"),
            at=when(at, "at"),
            by=text_arg(by, "by", empty=True),
        )
        with self._write() as conn:
            self._put_membership(conn, record)
            if audit is not None:
                insert_audit(conn, audit)
        return record

    def remove_membership(self, user_id: str, target: str, *, audit: AuditRow | None = None) -> bool:
        """Take a person out of ``target``; False when they were not in it (nothing changes, nothing is audited)."""
        with self._write() as conn:
            gone = conn.execute(
                delete(memberships).where(memberships.c.user_id == user_id, memberships.c.target == target)
            ).rowcount
            if gone and audit is not None:
                insert_audit(conn, audit)
        return bool(gone)

    def leave(
        self, user_id: str, target: str, *, at: datetime | None = None, audit: AuditRow | None = None
    ) -> MembersChanged:
        """Take a person out of ``target`` and revoke their keys in the projects they no longer reach, with ``audit``:
        one transaction, so a failure leaves the membership and the keys as they were. Nothing when they were not in it."""
        stamp = when(at, "revoked_at")
        with self._write() as conn:
            gone = conn.execute(
                delete(memberships).where(memberships.c.user_id == user_id, memberships.c.target == target)
            ).rowcount
            if not gone:
                return MembersChanged([], [], [])
            revoked = _revoke_unreachable(conn, [user_id], stamp)
            if audit is not None:
                insert_audit(conn, audit)
        return MembersChanged([], [user_id], revoked)

    def match_memberships(
        self,
        wanted: Mapping[Pair, str],
        *,
        targets: Collection[str],
        users: Collection[str] | None = None,
        owner: str | None = None,
        by: str = "",
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> MembershipsMatched:
        """:func:`match_in` in a transaction of its own, ``audit`` written with it when it changed something."""
        stamp = when(at, "at")
        with self._write() as conn:
            change = match_in(
                conn, wanted, targets=targets, users=users, owner=owner, by=text_arg(by, "by", empty=True), stamp=stamp
            )
            if audit is not None and change.changed:
                insert_audit(conn, audit)
        return change

    def list_memberships(self, user_id: str | None = None, target: str | None = None) -> list[MembershipRecord]:
        query = select(memberships).order_by(memberships.c.at, memberships.c.user_id, memberships.c.target)
        if user_id is not None:
            query = query.where(memberships.c.user_id == user_id)
        if target is not None:
            query = query.where(memberships.c.target == target)
        with self._read() as conn:
            return [_membership(r) for r in conn.execute(query)]

    def _put_membership(self, conn: Connection, record: MembershipRecord) -> None:
        if conn.execute(select(users.c.id).where(users.c.id == record.user_id)).first() is None:
            raise NotFound(f"no person {record.user_id!r}; GET /api/v1/users lists them")
        values = asdict(record)
        update_set = {"role": record.role, "at": record.at, "by": record.by}
        conn.execute(self._upsert(memberships, values, on=["user_id", "target"], update=update_set))


def membership_plan(
    held: Iterable[MembershipRecord], wanted: Mapping[Pair, str], *, owner: str | None
) -> tuple[dict[Pair, str], list[Pair]]:
    """What matching ``wanted`` (pair → role) changes among ``held``, the memberships of the slice it decides:
    (the pairs to make or give another role, the pairs to take out). With ``owner``, a membership someone else made
    (its ``by``) is neither changed nor taken out."""
    present = {(m.user_id, m.target): m for m in held}
    ours = {pair for pair, m in present.items() if owner is None or m.by == owner}
    setting = {
        pair: role
        for pair, role in wanted.items()
        if pair not in present or (pair in ours and present[pair].role != role)
    }
    return setting, sorted(ours - wanted.keys())


def match_in(
    conn: Connection,
    wanted: Mapping[Pair, str],
    *,
    targets: Collection[str],
    users: Collection[str] | None,
    owner: str | None,
    by: str,
    stamp: datetime,
) -> MembershipsMatched:
    """On ``conn``: the memberships in ``targets`` (of ``users`` when given) brought in line with ``wanted``
    (pair → member or manager): missing ones made ``by``, roles changed, the others taken out, and the keys of those
    who left revoked in the projects they no longer reach (:func:`membership_plan` says which; with ``owner`` only
    the memberships ``owner`` made are changed or taken out). ``wanted``'s own pairs are always in the slice."""
    for role in set(wanted.values()):
        _one_of(role, MEMBER_ROLES, "role")
    places = set(targets) | {t for _, t in wanted}
    query = select(memberships).where(memberships.c.target.in_(sorted(places)))
    if users is not None:
        query = query.where(memberships.c.user_id.in_(sorted(set(users) | {u for u, _ in wanted})))
    held = [_membership(r) for r in conn.execute(query)]
    setting, removing = membership_plan(held, wanted, owner=owner)
    present = {(m.user_id, m.target) for m in held}
    for (user_id, target), role in sorted(setting.items()):
        if (user_id, target) in present:
            conn.execute(
                update(memberships)
                .where(memberships.c.user_id == user_id, memberships.c.target == target)
                .values(role=role, at=stamp, by=by)
            )
        else:
            conn.execute(memberships.insert().values(user_id=user_id, target=target, role=role, at=stamp, by=by))
    for user_id, target in removing:
        conn.execute(delete(memberships).where(memberships.c.user_id == user_id, memberships.c.target == target))
    revoked = _revoke_unreachable(conn, sorted({u for u, _ in removing}), stamp) if removing else []
    return MembershipsMatched(sorted(setting), removing, revoked)


def _revoke_unreachable(conn: Connection, user_ids: Sequence[str], stamp: datetime) -> list[KeyRecord]:
    """Revoke, on ``conn``, these people's active API keys in projects none of their memberships reaches any more
    (through the project, its team or its organization); a project that is gone is reached by nobody."""
    chains = select(projects.c.id, projects.c.team_id, teams.c.org_id).join(teams, teams.c.id == projects.c.team_id)
    revoked: list[KeyRecord] = []
    for user_id in user_ids:
        held = set(conn.execute(select(memberships.c.target).where(memberships.c.user_id == user_id)).scalars())
        active = [
            KeyRecord(**row._mapping)
            for row in conn.execute(
                select(keys).where(
                    keys.c.user_id == user_id,
                    keys.c.kind == "api",
                    keys.c.project_id != "",
                    keys.c.revoked_at.is_(None),
                )
            )
        ]
        if not active:
            continue
        wanted = sorted({k.project_id for k in active})
        reached = {
            row.id
            for row in conn.execute(chains.where(projects.c.id.in_(wanted)))
            if held & {row.id, row.team_id, row.org_id}
        }
        lost = [k for k in active if k.project_id not in reached]
        if lost:
            conn.execute(
                update(keys)
                .where(keys.c.id.in_([k.id for k in lost]), keys.c.revoked_at.is_(None))
                .values(revoked_at=stamp)
            )
            revoked += [replace(k, revoked_at=stamp) for k in lost]
    return revoked


__all__ = [
    "MembersChanged",
    "MembershipRecord",
    "MembershipsMatched",
    "Pair",
    "PeopleRepo",
    "UserRecord",
    "match_in",
    "membership_plan",
    "new_user_id",
]
