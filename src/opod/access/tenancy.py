"""The tenancy tree in memory: organizations, teams, projects, and the people the people area adds.

Built from the store at start and changed only by its own methods, each after the store has
committed, so what the gateway reads never runs ahead of what survives a restart. The indexes
are rebuilt whole and swapped in one assignment: a reader sees the old tree or the new one.
``chain(project_id)`` is one dict lookup, for the gateway's every request. Other leaders of the
same store change the tree too: :meth:`Tenancy.run` reads it again every 2 s (three small tables,
read whole: cheaper to reason about than a change log) and swaps it in when it differs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from opod.access.scopes import KINDS, TENANCY_KINDS, Scope, ScopeRef, parse_scope
from opod.store import NotFound, OrgRecord, ProjectRecord, Store, TeamRecord, TenancyTree
from opod.store.audit import AuditDraft, AuditRow
from opod.store.errors import InvalidInput, StoreError
from opod.store.following import StaleRead
from opod.store.offloop import run_sync
from opod.store.tenancy import Level


@dataclass(frozen=True, slots=True)
class ProjectChain:
    project_id: str
    team_id: str
    org_id: str


class Person(Protocol):
    """A person as the people area keeps them (``opod.store.people``'s record)."""

    @property
    def id(self) -> str: ...

    @property
    def email(self) -> str: ...


class PeopleDirectory(Protocol):
    """What tenancy asks of the people area, in memory."""

    def user(self, id_or_email: str) -> Any | None:
        """The person with this ID or email (any case), or None."""
        ...

    def user_active(self, user_id: str) -> bool: ...

    def memberships(self, user_id: str) -> Sequence[Any]:
        """This person's memberships, each with ``target``: the org, team or project ID it is on."""
        ...


@dataclass(frozen=True, slots=True)
class _Index:
    orgs: Mapping[str, OrgRecord] = field(default_factory=dict)
    teams: Mapping[str, TeamRecord] = field(default_factory=dict)
    projects: Mapping[str, ProjectRecord] = field(default_factory=dict)
    chains: Mapping[str, ProjectChain] = field(default_factory=dict)
    org_by_name: Mapping[str, str] = field(default_factory=dict)
    team_by_name: Mapping[tuple[str, str], str] = field(default_factory=dict)
    project_by_name: Mapping[tuple[str, str], str] = field(default_factory=dict)


def _index(orgs: list[OrgRecord], teams: list[TeamRecord], projects: list[ProjectRecord]) -> _Index:
    team_org = {t.id: t.org_id for t in teams}
    return _Index(
        orgs=MappingProxyType({o.id: o for o in orgs}),
        teams=MappingProxyType({t.id: t for t in teams}),
        projects=MappingProxyType({p.id: p for p in projects}),
        chains=MappingProxyType({p.id: ProjectChain(p.id, p.team_id, team_org.get(p.team_id, "")) for p in projects}),
        org_by_name=MappingProxyType({o.name: o.id for o in orgs}),
        team_by_name=MappingProxyType({(t.org_id, t.name): t.id for t in teams}),
        project_by_name=MappingProxyType({(p.team_id, p.name): p.id for p in projects}),
    )


_NOUN = {"org": "organization", "team": "team", "project": "project", "user": "person", "key": "key"}
_PARENT: dict[Level, Level | None] = {"org": None, "team": "org", "project": "team"}


class Tenancy:
    def __init__(self, store: Store, tree: TenancyTree, people: PeopleDirectory | None = None) -> None:
        """Use :meth:`load`; ``people`` is the people area's directory, where it exists."""
        self.store = store
        self.people = people
        self._ix = _index(tree.orgs, tree.teams, tree.projects)
        self._changes = 0
        """Bumped by every change made here, so a read of the store that overlapped one is not applied over it."""

    @classmethod
    def load(cls, store: Store, people: PeopleDirectory | None = None) -> Tenancy:
        """Read the tree from the store (at start-up, off the loop)."""
        return cls(store, store.tenancy_tree(), people)

    # --- reading (the gateway and every area) ----------------------------------------------

    @property
    def orgs(self) -> list[OrgRecord]:
        return list(self._ix.orgs.values())

    @property
    def teams(self) -> list[TeamRecord]:
        return list(self._ix.teams.values())

    @property
    def projects(self) -> list[ProjectRecord]:
        return list(self._ix.projects.values())

    def chain(self, project_id: str) -> ProjectChain | None:
        """The project's team and organization; None for a project not known (or ``""``)."""
        return self._ix.chains.get(project_id)

    def path(self, project_id: str) -> str:
        """``org/team/project`` by name; ``""`` for a project not known."""
        ix = self._ix
        project = ix.projects.get(project_id)
        if project is None:
            return ""
        team = ix.teams[project.team_id]
        return f"{ix.orgs[team.org_id].name}/{team.name}/{project.name}"

    def names(self, scope: Scope) -> list[str]:
        """The names from the organization down to ``scope`` (``["acme", "ml"]``); ``[]`` when unknown."""
        ix = self._ix
        if scope.kind == "org" and scope.id in ix.orgs:
            return [ix.orgs[scope.id].name]
        if scope.kind == "team" and scope.id in ix.teams:
            team = ix.teams[scope.id]
            return [ix.orgs[team.org_id].name, team.name]
        if scope.kind == "project" and scope.id in ix.projects:
            return self.path(scope.id).split("/")
        if scope.kind == "user":
            person = self.user(scope.id)
            return [str(getattr(person, "email", "") or scope.id)] if person is not None else []
        return []

    def name(self, scope: Scope) -> str:
        """How a person reads a scope: ``Acme / ml``; its ID when it has no name."""
        return " / ".join(self.names(scope)) or scope.id

    def scope_path(self, scope: Scope) -> str:
        """``acme/ml``: the path by name, as requests write it; the ID when unknown."""
        return "/".join(self.names(scope)) or scope.id

    def ancestors(self, scope: Scope) -> list[Scope]:
        """The scope itself first, then its team and organization (a person or key: itself only)."""
        ix = self._ix
        if scope.kind == "project":
            chain = ix.chains.get(scope.id)
            if chain is None:
                return [scope]
            return [scope, Scope("team", chain.team_id), Scope("org", chain.org_id)]
        if scope.kind == "team":
            team = ix.teams.get(scope.id)
            return [scope] + ([Scope("org", team.org_id)] if team is not None else [])
        return [scope]

    def user(self, id_or_email: str) -> Any | None:
        """The person with this ID or email, from the people area; None without it or when unknown."""
        return self.people.user(id_or_email) if self.people is not None and id_or_email else None

    def user_active(self, user_id: str) -> bool:
        return self.people.user_active(user_id) if self.people is not None else True

    def belongs(self, user_id: str, project_id: str) -> bool | None:
        """Whether the person is a member of the project (through it, its team or its organization);
        None where the people area does not exist, so membership cannot be said."""
        if self.people is None:
            return None
        targets = {m.target for m in self.people.memberships(user_id)}
        return any(s.id in targets for s in self.ancestors(Scope("project", project_id)))

    def resolve(self, text: str, *, kinds: Collection[str] = KINDS, field: str = "scope") -> Scope:
        """The scope a text names; InvalidInput for bad syntax, NotFound naming what was looked for."""
        return self.find(parse_scope(text, kinds=kinds, field=field), field=field)

    def find(self, ref: ScopeRef, *, field: str = "scope") -> Scope:
        ix = self._ix
        what = f"{field}: no {_NOUN[ref.kind]} {ref.text!r}"
        if ref.kind == "key":
            return Scope("key", ref.id)
        if ref.kind == "user":
            person = self.user(ref.id or ref.names[0])
            if person is None:
                raise NotFound(f"{what}; GET /api/v1/users lists the people (by ID or email)")
            return Scope("user", str(person.id))
        hint = "; GET /api/v1/orgs lists the tree"
        if ref.by_id:
            table: Mapping[str, Any] = {"org": ix.orgs, "team": ix.teams, "project": ix.projects}[ref.kind]
            if ref.id not in table:
                raise NotFound(what + hint)
            return Scope(ref.kind, ref.id)
        org_id = ix.org_by_name.get(ref.names[0])
        if org_id is None:
            raise NotFound(f"{what}: there is no organization {ref.names[0]!r}{hint}")
        if ref.kind == "org":
            return Scope("org", org_id)
        team_id = ix.team_by_name.get((org_id, ref.names[1]))
        if team_id is None:
            raise NotFound(f"{what}: organization {ref.names[0]!r} has no team {ref.names[1]!r}{hint}")
        if ref.kind == "team":
            return Scope("team", team_id)
        project_id = ix.project_by_name.get((team_id, ref.names[2]))
        if project_id is None:
            raise NotFound(f"{what}: team {ref.names[0]}/{ref.names[1]} has no project {ref.names[2]!r}{hint}")
        return Scope("project", project_id)

    def node(self, level: Level, text: str, *, field: str = "id") -> Scope:
        """An organization, team or project named by ID, or by name or path (``acme``, ``acme/ml``, ``acme/ml/chat``)."""
        ref = parse_scope(text, kinds=(level,), field=field)
        return self.find(ref, field=field)

    # --- following other leaders ---------------------------------------------------------------

    async def follow(self) -> bool:
        """Read the tree again and swap it in when it differs; True when it did. The leader's
        :class:`~opod.store.following.Following` calls it when the store changed: organizations, teams and
        projects another leader changed are in force here within 2 s.

        Raises :class:`~opod.store.following.StaleRead` when a change made here overlapped the read, which may
        be older than it: the read is dropped and made again at the next look."""
        before = self._changes
        tree = await run_sync(self.store.tenancy_tree)
        if self._changes != before:
            raise StaleRead("the tenancy tree changed here during the read")
        ix = self._ix
        fresh = _index(tree.orgs, tree.teams, tree.projects)
        if (dict(fresh.orgs), dict(fresh.teams), dict(fresh.projects)) == (
            dict(ix.orgs),
            dict(ix.teams),
            dict(ix.projects),
        ):
            return False
        self._ix = fresh
        return True

    # --- changing (store first, then memory) -----------------------------------------------

    async def create(
        self, level: Level, name: str | None, parent: str | None, *, audit: AuditDraft | None = None
    ) -> Any:
        """Add an organization, or a team in ``parent`` (an organization), or a project in ``parent`` (a team),
        each named by ID, name or path; the audit names it by its path."""
        if not name:
            raise InvalidInput(f"name: give the {_NOUN[level]} a name (letters, digits and ._-, at most 64)")
        if level == "org" and parent:
            raise InvalidInput("in: an organization is at the top of the tree; leave in out")
        where = ""
        if parent:
            try:  # the target names the parent by path however the caller named it; a bad parent is refused below
                where = self.scope_path(self.node("team" if level == "project" else "org", parent, field="in")) + "/"
            except StoreError:
                where = f"{parent}/"
        with _committing(audit, target=f"{level}:{where}{name}") as row:
            parent_id = self._parent(level, parent)
            if level == "org":
                record: Any = await run_sync(self.store.create_org, name, audit=row)
            elif level == "team":
                record = await run_sync(self.store.create_team, parent_id, name, audit=row)
            else:
                record = await run_sync(self.store.create_project, parent_id, name, audit=row)
        self._changes += 1
        self._apply(level, record)
        return record

    async def change(
        self, level: Level, id: str, *, name: str | None, parent: str | None, audit: AuditDraft | None = None
    ) -> Any:
        """Rename and/or move (``parent``: the organization or team it goes in); ``id`` as :meth:`node` reads it."""
        if name is None and parent is None:
            below = (
                ""
                if level == "org"
                else f" (a {_NOUN[level]} goes in a {'organization' if level == 'team' else 'team'})"
            )
            raise InvalidInput("name or in: give a new name to rename it, or in to move it" + below)
        if level == "org" and parent:
            raise InvalidInput("in: an organization is at the top of the tree and cannot be moved; leave in out")
        scope = self.node(level, id)
        changed = {k: v for k, v in (("name", name), ("in", parent)) if v is not None}
        detail = {"was": f"{level}:{self.scope_path(scope)}", **changed}
        with _committing(audit, target=f"{level}:{scope.id}", detail=detail) as row:
            parent_id = self._parent(level, parent, moving=scope) if parent is not None else None
            record = await run_sync(
                self.store.change_tenancy, level, scope.id, name=name, parent_id=parent_id, audit=row
            )
        self._changes += 1
        self._apply(level, record)
        return record

    async def delete(self, level: Level, id: str, *, audit: AuditDraft | None = None) -> Scope:
        """Remove an empty organization, team or project; ``id`` as :meth:`node` reads it."""
        scope = self.node(level, id)
        with _committing(audit, target=f"{level}:{scope.id}", detail={"path": self.scope_path(scope)}) as row:
            await run_sync(self.store.delete_tenancy, level, scope.id, audit=row)
        self._changes += 1
        ix = self._ix
        orgs = [o for o in ix.orgs.values() if o.id != scope.id]
        teams = [t for t in ix.teams.values() if t.id != scope.id]
        projects = [p for p in ix.projects.values() if p.id != scope.id]
        self._ix = _index(orgs, teams, projects)
        return scope

    async def counts(self) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
        """(scope ID → people holding a membership on it directly, project ID → (keys, active keys)), from the store."""
        return await run_sync(self.store.member_counts), await run_sync(self.store.key_counts)

    def mark_had_key(self, project_id: str) -> None:
        """A key was stored for this project (the store marked it in the same transaction)."""
        project = self._ix.projects.get(project_id)
        if project is not None and not project.had_key:
            self._changes += 1
            self._apply("project", replace(project, had_key=True))

    def _parent(self, level: Level, text: str | None, *, moving: Scope | None = None) -> str:
        above = _PARENT[level]
        if above is None:
            if text:
                raise InvalidInput("in: an organization is at the top of the tree; leave in out")
            return ""
        if not text:
            raise InvalidInput(
                f"in: name the {_NOUN[above]} the {_NOUN[level]} goes in, by ID or "
                f"{'name' if above == 'org' else 'path (ORG/TEAM)'}"
            )
        try:
            ref = parse_scope(text, kinds=TENANCY_KINDS, field="in")
        except InvalidInput:
            ref = parse_scope(text, kinds=(above,), field="in")
        if ref.kind != above:
            itself = moving is not None and ref.kind == level and self.find(ref, field="in") == moving
            why = "into itself" if itself else f"into a {_NOUN[ref.kind]}"
            raise InvalidInput(
                f"in: {text!r} names a {_NOUN[ref.kind]}; a {_NOUN[level]} goes in a {_NOUN[above]}, "
                f"never {why} (that would make a cycle); name a{'n' if above == 'org' else ''} {_NOUN[above]}"
            )
        return self.find(ref, field="in").id

    def _apply(self, level: Level, record: Any) -> None:
        ix = self._ix
        orgs, teams, projects = dict(ix.orgs), dict(ix.teams), dict(ix.projects)
        if level == "org":
            orgs[record.id] = record
        elif level == "team":
            teams[record.id] = record
        else:
            projects[record.id] = record
        self._ix = _index(list(orgs.values()), list(teams.values()), list(projects.values()))


@contextmanager
def _committing(audit: AuditDraft | None, *, target: str, detail: Any = None) -> Iterator[AuditRow | None]:
    """The draft's row to write with a change (:meth:`AuditDraft.commit`); none for a change made without a call
    of the API (at start-up, in tests)."""
    if audit is None:
        yield None
        return
    with audit.commit(target=target, detail=detail) as row:
        yield row


__all__ = ["PeopleDirectory", "Person", "ProjectChain", "Tenancy"]


class TenancyScopes:
    """The tenancy tree as the fleet's services read it (:class:`opod.fleet.scopes.ScopeTree`): scopes as
    ``kind:ID`` texts."""

    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    def scope(self, text: str, *, kinds: Collection[str], field: str) -> str:
        return self.tenancy.resolve(text, kinds=kinds, field=field).text

    def _find(self, text: str) -> Scope | None:
        try:
            return self.tenancy.resolve(text, kinds=TENANCY_KINDS)
        except (InvalidInput, NotFound):
            return None

    def chain(self, scope: str) -> tuple[str, ...]:
        found = self._find(scope)
        return tuple(s.text for s in self.tenancy.ancestors(found)) if found is not None else ()

    def label(self, scope: str) -> str:
        found = self._find(scope)
        return self.tenancy.name(found) if found is not None else ""
