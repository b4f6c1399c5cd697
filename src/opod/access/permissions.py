"""What a signed-in person may do: their role across the fleet, and their memberships within the tenancy tree.

The rule, in one place:

- ``viewer`` reads everything operators see (every read of ``/api/v1`` but request bodies);
- ``operator`` also changes the fleet: nodes, models, presets, placement, replicas, quotas;
- ``billing`` also changes prices and budgets (a settings change that touches nothing else) and reads usage;
- ``admin`` does everything: people, tenancy, settings, secrets, request bodies;
- a **member** of a project (through it, its team or its organization) makes and revokes their own keys in it,
  lists its keys and sees its usage;
- a **manager** of an organization, team or project manages the keys and the members within it.

The admin key is not a person and is not checked here: it may do everything, as before. Each check
raises :class:`~opod.store.errors.Forbidden` saying what was refused and who may do it; a page asks the
same questions with :meth:`Permissions.allows` and the ``may_…`` methods to decide what it shows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum
from typing import Protocol

from opod.access.scopes import Scope, id_kind
from opod.access.tenancy import Tenancy
from opod.store.errors import Forbidden
from opod.store.people import MembershipRecord, UserRecord


class Action(StrEnum):
    """What an operation needs; :data:`opod.control.permits.OPERATIONS` maps every operation of /api/v1 to one."""

    READ = "read"
    """Any role: the fleet, models, usage, audit, people, settings."""
    OPERATE = "operate"
    """operator or admin: change the fleet."""
    ADMINISTER = "administer"
    """admin only: people, tenancy, settings, secrets, request bodies."""
    SETTINGS = "settings"
    """admin; billing when the change touches prices and budgets alone."""
    KEYS_READ = "keys.read"
    """Any role; a member or manager for the keys of a project they reach."""
    KEYS = "keys"
    """admin; a manager of the key's project (or its team or organization); a member their own key in their project."""
    MEMBERS = "members"
    """admin; a manager of the place (or a place above it)."""


ROLES: dict[str, frozenset[Action]] = {
    "viewer": frozenset({Action.READ, Action.KEYS_READ}),
    "operator": frozenset({Action.READ, Action.KEYS_READ, Action.OPERATE}),
    "billing": frozenset({Action.READ, Action.KEYS_READ}),
    "admin": frozenset(Action),
}
"""What each role may do anywhere; a person with no role holds only what their memberships give."""

BILLING_SECTIONS = frozenset({"prices", "budgets"})
"""The settings sections billing changes."""

_WHO = {
    Action.READ: "a person with a role (viewer, operator, billing or admin)",
    Action.OPERATE: "an operator or an admin",
    Action.ADMINISTER: "an admin",
    Action.SETTINGS: "an admin (billing: prices and budgets alone)",
    Action.KEYS_READ: "a person with a role, or a member of the project",
    Action.KEYS: "an admin, a manager of the project, or a member for their own key",
    Action.MEMBERS: "an admin or a manager of the place",
}


class MembershipsOf(Protocol):
    """The people area as permissions read it (:class:`opod.access.people.People`)."""

    def memberships(self, user_id: str) -> Sequence[MembershipRecord]: ...


class Permissions:
    """Answers what a person may do, from their role and their memberships (in memory)."""

    def __init__(self, people: MembershipsOf, tenancy: Tenancy) -> None:
        self._people = people
        self._tenancy = tenancy

    # --- questions ---------------------------------------------------------------------------------

    def allows(self, person: UserRecord, action: Action) -> bool:
        """Whether the person's role alone allows ``action`` everywhere."""
        return action in ROLES.get(person.role, frozenset())

    def reaches(self, person: UserRecord, project_id: str) -> bool:
        """Whether the person is a member or manager of the project, its team or its organization."""
        return bool(self._held(person, project_id, ("member", "manager")))

    def manages(self, person: UserRecord, scope_id: str) -> bool:
        """Whether the person manages the org, team or project ``scope_id``, or a place above it."""
        return bool(self._held(person, scope_id, ("manager",)))

    def may_see_usage(self, person: UserRecord, project_id: str) -> bool:
        """A project's usage and budget: any role, or a member of the project."""
        return self.allows(person, Action.READ) or self.reaches(person, project_id)

    # --- checks (Forbidden when refused) -----------------------------------------------------------

    def require(self, person: UserRecord, action: Action, what: str) -> None:
        """``what`` needs ``action`` everywhere (the role alone decides)."""
        if not self.allows(person, action):
            raise Forbidden(f"{what} needs {_WHO[action]}; {self._is(person)}")

    def require_key_read(self, person: UserRecord, project_id: str, what: str) -> None:
        if self.allows(person, Action.KEYS_READ) or (project_id and self.reaches(person, project_id)):
            return
        raise Forbidden(f"{what} needs {_WHO[Action.KEYS_READ]}; {self._is(person)}")

    def require_key_change(self, person: UserRecord, project_id: str, owner_id: str, what: str) -> None:
        """Making or revoking a key of ``project_id`` (``""``: none) held by ``owner_id`` (``""``: nobody)."""
        if self.allows(person, Action.KEYS) or (project_id and self.manages(person, project_id)):
            return
        if project_id and self.reaches(person, project_id):
            if owner_id == person.id:
                return
            raise Forbidden(
                f"{what}: as a member of project {self._tenancy.path(project_id)} you make and revoke your own keys "
                f"only (user: {person.id}); a manager of the project handles the others'"
            )
        where = f"project {self._tenancy.path(project_id)}" if project_id else "no project"
        raise Forbidden(f"{what}: a key in {where} needs {_WHO[Action.KEYS]}; {self._is(person)}")

    def require_members_change(self, person: UserRecord, target_id: str, what: str) -> None:
        if self.allows(person, Action.MEMBERS) or self.manages(person, target_id):
            return
        raise Forbidden(f"{what} needs {_WHO[Action.MEMBERS]}; {self._is(person)}")

    def require_settings_change(self, person: UserRecord, changed: Collection[str], what: str) -> None:
        """A new settings version that differs from the one in force in the sections ``changed``."""
        if self.allows(person, Action.SETTINGS):
            return
        if person.role == "billing":
            others = sorted(set(changed) - BILLING_SECTIONS)
            if not others:
                return
            raise Forbidden(f"{what}: billing changes prices and budgets only; this also changes {', '.join(others)}")
        raise Forbidden(f"{what} needs {_WHO[Action.SETTINGS]}; {self._is(person)}")

    # --- inside ------------------------------------------------------------------------------------

    def _held(self, person: UserRecord, scope_id: str, roles: tuple[str, ...]) -> list[str]:
        kind = id_kind(scope_id)
        above = {s.id for s in self._tenancy.ancestors(Scope(kind, scope_id))} if kind else {scope_id}
        return [m.target for m in self._people.memberships(person.id) if m.target in above and m.role in roles]

    @staticmethod
    def _is(person: UserRecord) -> str:
        return f"{person.email} is {person.role}" if person.role else f"{person.email} has no role"


__all__ = ["BILLING_SECTIONS", "ROLES", "Action", "MembershipsOf", "Permissions"]
