"""Organizations, teams and projects: the tenancy tree every key, person, quota and budget hangs from.

Names are unique among siblings; a team moves to another organization and a project to another
team with everything under it; a node is removed only when empty, and a project that ever had a
key is only renamed (usage refers to it). Each change commits with its audit row.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Table, case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.schema import keys, metadata, orgs, projects, teams

Level = Literal["org", "team", "project"]

ID_PREFIX: dict[Level, str] = {"org": "org_", "team": "team_", "project": "prj_"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_LOOKS_LIKE_ID = re.compile(r"(org|team|prj|usr|k)_.*")


def new_tenancy_id(level: Level) -> str:
    return ID_PREFIX[level] + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class OrgRecord:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TeamRecord:
    id: str
    org_id: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ProjectRecord:
    id: str
    team_id: str
    name: str
    had_key: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TenancyTree:
    """The whole tree at one moment, oldest first at each level."""

    orgs: list[OrgRecord]
    teams: list[TeamRecord]
    projects: list[ProjectRecord]


def tenancy_name(value: object, level: Level) -> str:
    """A name as the API takes it: letters, digits and ``._-``, no ``/`` or ``:`` (they separate paths and scopes)."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"name: give the {_noun(level)} a name (letters, digits and ._-, at most 64)")
    if not NAME.fullmatch(value) or _LOOKS_LIKE_ID.fullmatch(value):
        raise InvalidInput(
            f"name: {value!r} is not a name; use letters, digits and ._- (at most 64, starting with a letter "
            "or digit, not starting like an ID: org_, team_, prj_, usr_, k_)"
        )
    return value


def _noun(level: Level) -> str:
    return {"org": "organization", "team": "team", "project": "project"}[level]


def _table(level: Level) -> Table:
    return {"org": orgs, "team": teams, "project": projects}[level]


def _memberships() -> Table | None:
    """The people area's memberships table, where that area exists: read for counts and for emptiness."""
    table = metadata.tables.get("memberships")
    return table if table is not None and "target" in table.c else None


def _taken(level: Level, name: str, parent_name: str) -> Conflict:
    where = f" in {parent_name}" if parent_name else ""
    return Conflict(f"name: a {_noun(level)} named {name!r} already exists{where}; choose another name")


class TenancyRepo(Repository):
    def tenancy_tree(self) -> TenancyTree:
        with self._read() as conn:
            return TenancyTree(
                [OrgRecord(**r._mapping) for r in conn.execute(select(orgs).order_by(orgs.c.created_at, orgs.c.id))],
                [
                    TeamRecord(**r._mapping)
                    for r in conn.execute(select(teams).order_by(teams.c.created_at, teams.c.id))
                ],
                [
                    ProjectRecord(**r._mapping)
                    for r in conn.execute(select(projects).order_by(projects.c.created_at, projects.c.id))
                ],
            )

    def member_counts(self) -> dict[str, int]:
        """Scope id → how many people hold a membership on it directly; empty where the people area has no table."""
        table = _memberships()
        if table is None:
            return {}
        with self._read() as conn:
            rows = conn.execute(select(table.c.target, func.count()).group_by(table.c.target))
            return {str(target): int(count) for target, count in rows}

    def key_counts(self) -> dict[str, tuple[int, int]]:
        """Project id → (keys, active keys); a key is active while neither revoked nor expired."""
        now = when(None, "now")
        active = case(
            (keys.c.revoked_at.is_(None) & (keys.c.expires_at.is_(None) | (keys.c.expires_at > now)), 1), else_=0
        )
        query = (
            select(keys.c.project_id, func.count(), func.coalesce(func.sum(active), 0))
            .where(keys.c.project_id != "")
            .group_by(keys.c.project_id)
        )
        with self._read() as conn:
            return {str(p): (int(n), int(a)) for p, n, a in conn.execute(query)}

    # --- create -------------------------------------------------------------------------

    def create_org(self, name: str, *, audit: AuditRow | None = None, created_at: datetime | None = None) -> OrgRecord:
        record = OrgRecord(new_tenancy_id("org"), tenancy_name(name, "org"), when(created_at, "created_at"))
        return self._insert("org", record, "", audit)

    def create_team(
        self, org_id: str, name: str, *, audit: AuditRow | None = None, created_at: datetime | None = None
    ) -> TeamRecord:
        record = TeamRecord(
            new_tenancy_id("team"), text_arg(org_id, "in"), tenancy_name(name, "team"), when(created_at, "created_at")
        )
        return self._insert("team", record, org_id, audit)

    def create_project(
        self, team_id: str, name: str, *, audit: AuditRow | None = None, created_at: datetime | None = None
    ) -> ProjectRecord:
        record = ProjectRecord(
            new_tenancy_id("project"),
            text_arg(team_id, "in"),
            tenancy_name(name, "project"),
            False,
            when(created_at, "created_at"),
        )
        return self._insert("project", record, team_id, audit)

    def _insert(self, level: Level, record: Any, parent_id: str, audit: AuditRow | None) -> Any:
        values = {k: getattr(record, k) for k in record.__slots__}
        try:
            with self._write() as conn:
                parent_name = _parent_name(conn, level, parent_id)
                self._refuse_sibling(conn, level, record.name, parent_id, parent_name, None)
                conn.execute(insert(_table(level)).values(**values))
                if audit is not None:
                    insert_audit(conn, audit)
        except IntegrityError as err:
            raise _taken(level, record.name, "") from err
        return record

    def _refuse_sibling(
        self, conn: Connection, level: Level, name: str, parent_id: str, parent_name: str, own_id: str | None
    ) -> None:
        table = _table(level)
        query = select(table.c.id).where(table.c.name == name)
        if level == "team":
            query = query.where(teams.c.org_id == parent_id)
        elif level == "project":
            query = query.where(projects.c.team_id == parent_id)
        other = conn.execute(query).scalar()
        if other is not None and other != own_id:
            raise _taken(level, name, parent_name)

    # --- change ---------------------------------------------------------------------------

    def change_tenancy(
        self,
        level: Level,
        id: str,
        *,
        name: str | None = None,
        parent_id: str | None = None,
        audit: AuditRow | None = None,
    ) -> Any:
        """Rename and/or move (a team to another organization, a project to another team); returns the new record."""
        if level == "org" and parent_id is not None:
            raise InvalidInput("in: an organization is at the top of the tree and cannot be moved; leave in out")
        if name is None and parent_id is None:
            raise InvalidInput("give name to rename, or in to move (a team to an organization, a project to a team)")
        table = _table(level)
        try:
            with self._write() as conn:
                row = conn.execute(select(table).where(table.c.id == id)).first()
                if row is None:
                    raise NotFound(f"no {_noun(level)} with ID {id!r}; GET /api/v1/orgs lists the tree")
                current = dict(row._mapping)
                parent_column = {"org": None, "team": "org_id", "project": "team_id"}[level]
                new_parent = parent_id if parent_id is not None else (current[parent_column] if parent_column else "")
                parent_name = _parent_name(conn, level, new_parent)
                new_name = tenancy_name(name, level) if name is not None else current["name"]
                self._refuse_sibling(conn, level, new_name, new_parent, parent_name, id)
                values: dict[str, Any] = {"name": new_name}
                if parent_column:
                    values[parent_column] = new_parent
                conn.execute(update(table).where(table.c.id == id).values(**values))
                if audit is not None:
                    insert_audit(conn, audit)
                current.update(values)
        except IntegrityError as err:
            raise _taken(level, name or "", "") from err
        return {"org": OrgRecord, "team": TeamRecord, "project": ProjectRecord}[level](**current)

    # --- delete ---------------------------------------------------------------------------

    def delete_tenancy(self, level: Level, id: str, *, audit: AuditRow | None = None) -> None:
        """Remove an empty node: an organization without teams, a team without projects, a project without people or keys."""
        table = _table(level)
        with self._write() as conn:
            row = conn.execute(select(table).where(table.c.id == id)).first()
            if row is None:
                raise NotFound(f"no {_noun(level)} with ID {id!r}; GET /api/v1/orgs lists the tree")
            name = row._mapping["name"]
            if level == "org":
                held = conn.execute(select(func.count()).select_from(teams).where(teams.c.org_id == id)).scalar_one()
                if held:
                    raise Conflict(f"organization {name!r} still has {held} team(s); move or remove them first")
            elif level == "team":
                held = conn.execute(
                    select(func.count()).select_from(projects).where(projects.c.team_id == id)
                ).scalar_one()
                if held:
                    raise Conflict(f"team {name!r} still has {held} project(s); move or remove them first")
            else:
                if (
                    row._mapping["had_key"]
                    or conn.execute(select(keys.c.id).where(keys.c.project_id == id).limit(1)).first()
                ):
                    raise Conflict(
                        f"project {name!r} has had keys, and usage refers to it: it can only be renamed "
                        "(PATCH /api/v1/projects/{id} with a new name)"
                    )
            members = _memberships()
            if members is not None:
                people = conn.execute(
                    select(func.count()).select_from(members).where(members.c.target == id)
                ).scalar_one()
                if people:
                    raise Conflict(
                        f"{_noun(level)} {name!r} still has {people} member(s); remove their memberships first"
                    )
            conn.execute(delete(table).where(table.c.id == id))
            if audit is not None:
                insert_audit(conn, audit)


def _parent_name(conn: Connection, level: Level, parent_id: str) -> str:
    """The parent's name, checking it exists; ``""`` for an organization (it has none)."""
    if level == "org":
        return ""
    parent = teams if level == "project" else orgs
    noun = "team" if level == "project" else "organization"
    found = conn.execute(select(parent.c.name).where(parent.c.id == parent_id)).scalar()
    if found is None:
        raise NotFound(f"in: no {noun} with ID {parent_id!r}; GET /api/v1/orgs lists the tree")
    return str(found)


__all__ = ["OrgRecord", "ProjectRecord", "TeamRecord", "TenancyRepo", "TenancyTree", "new_tenancy_id", "tenancy_name"]
