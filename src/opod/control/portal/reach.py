"""What a signed-in person reaches: the projects that are theirs, the scopes they are in, the models they may use.

A project is theirs when they are a member or manager of it, its team or its organization
(:meth:`opod.access.tenancy.Tenancy.belongs`, the rule the keys service checks too). They are *in*
a scope when it is one of their memberships, lies under one (a team of their organization), or
lies above a project of theirs. A model owned by a scope (``catalog.Model.owner``, kept as
``kind:ID``) is for the people in that scope; a model with no owner is for everyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opod.access.scopes import Scope, id_kind
from opod.access.tenancy import Tenancy
from opod.control.console.auth import Viewer
from opod.store import ProjectRecord


class Memberships(Protocol):
    """The people area as the portal reads it (:class:`opod.access.people.People`)."""

    def targets(self, user_id: str) -> list[str]:
        """The org, team and project ids this person holds a membership on."""
        ...


@dataclass(frozen=True, slots=True)
class Project:
    id: str
    path: str
    """``org/team/project`` by name."""


@dataclass(frozen=True, slots=True)
class Reach:
    user_id: str
    projects: Sequence[Project]
    """Theirs, by path."""
    scopes: frozenset[str]
    """``kind:ID`` of every org, team and project they are in."""

    def holds(self, project_id: str) -> bool:
        return any(p.id == project_id for p in self.projects)

    def may_use(self, owner: str | None) -> bool:
        """Whether a model owned by ``owner`` (``kind:ID``; ``None`` or ``""``: nobody) is for this person."""
        return not owner or owner in self.scopes


def reach_of(viewer: Viewer, people: Memberships, tenancy: Tenancy) -> Reach:
    """What ``viewer`` reaches now (memberships and the tree are read from memory: no store call)."""
    user_id = viewer.user_id
    if not user_id:
        return Reach("", (), frozenset())
    targets = set(people.targets(user_id))
    projects: list[ProjectRecord] = [p for p in tenancy.projects if tenancy.belongs(user_id, p.id)]
    scopes = {s.text for p in projects for s in tenancy.ancestors(Scope("project", p.id))}
    for target in targets:
        kind = id_kind(target)
        if kind is not None:
            scopes.add(Scope(kind, target).text)
    scopes |= {Scope("team", t.id).text for t in tenancy.teams if t.org_id in targets}
    found = sorted((Project(p.id, tenancy.path(p.id)) for p in projects), key=lambda p: p.path)
    return Reach(user_id, tuple(found), frozenset(scopes))
