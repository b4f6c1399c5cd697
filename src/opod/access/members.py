"""Where people belong, as an operator changes it: memberships in organizations, teams and projects.

A person is put in a place (``org:NAME``, ``team:ORG/TEAM``, ``project:ORG/TEAM/PROJECT`` or an
ID) with a role; taken out of one, they lose their keys in the projects no membership they keep
still reaches (through the project, its team or its organization), in the same transaction. The
changes go through :class:`~opod.access.people.People`, the one writer of people, each with its
audit row; the audit names the projects whose keys go.
"""

from __future__ import annotations

from opod.access.people import People
from opod.access.scopes import Scope, id_kind
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy
from opod.store.audit import AuditDraft
from opod.store.errors import InvalidInput, NotFound
from opod.store.people import MembershipRecord, UserRecord
from opod.store.schema import MEMBER_ROLES, USER_STATES

MEMBERSHIP_KINDS = ("org", "team", "project")


class Memberships:
    """People as the management API reads them, and the rules of putting them in places and taking them out."""

    def __init__(self, people: People, tenancy: Tenancy, access: AccessService) -> None:
        self.people = people
        self.tenancy = tenancy
        self.access = access

    # --- reads -------------------------------------------------------------------------------------

    def users(self, state: str | None = None) -> list[UserRecord]:
        """Everyone (oldest first), or those in ``state``."""
        if state is not None and state not in USER_STATES:
            raise InvalidInput(f"state: {state!r} is not one of {', '.join(USER_STATES)}; leave it out for everyone")
        return self.people.users(state)

    def user(self, id_or_email: str) -> UserRecord:
        """A person by ID or email; ``NotFound`` saying where they are listed."""
        user = self.people.user(id_or_email)
        if user is None:
            raise NotFound(f"no person {id_or_email!r} (an ID usr_… or an email); GET /api/v1/users lists them")
        return user

    def memberships(self, user_id: str) -> list[MembershipRecord]:
        return self.people.memberships(user_id)

    def path(self, target: str) -> str:
        """``acme``, ``acme/ml`` or ``acme/ml/chat`` for an org, team or project id; the id itself once it is gone."""
        kind = id_kind(target)
        if kind is None:
            return target
        return self.tenancy.scope_path(Scope(kind, target))

    # --- changes -----------------------------------------------------------------------------------

    async def join(self, id_or_email: str, target: str | None, role: str | None, *, audit: AuditDraft) -> UserRecord:
        """Put the person in ``target`` with ``role`` (``member`` when left out), or change their role there."""
        user = self.user(id_or_email)
        role = role or "member"
        if role not in MEMBER_ROLES:
            raise InvalidInput(f"role: {role!r} is not one of {', '.join(MEMBER_ROLES)} (member when left out)")
        scope = self._target(target)
        detail = {"target": scope.text, "path": self.path(scope.id), "role": role}
        with audit.commit(target=f"user:{user.id}", detail=detail) as row:
            await self.people.join(user.id, scope.id, role=role, by=audit.actor, audit=row)
        return user

    async def leave(self, id_or_email: str, target: str | None, *, audit: AuditDraft) -> UserRecord:
        """Take the person out of ``target``; their keys in the projects they no longer reach are revoked with it."""
        user = self.user(id_or_email)
        scope = self._target(target)
        held = {m.target for m in self.people.memberships(user.id)}
        if scope.id not in held:
            raise NotFound(
                f"target: {user.email} is not a member of {scope.text}; GET /api/v1/users/{user.id} says where they are"
            )
        losing = self._unreachable(held - {scope.id}, await self._keyed_projects(user.id))
        detail = {
            "target": scope.text,
            "path": self.path(scope.id),
            "revokes_keys_in": [self.path(p) for p in losing],
        }
        with audit.commit(target=f"user:{user.id}", detail=detail) as row:
            await self.people.leave(user.id, scope.id, audit=row)
        return user

    # --- the rules ---------------------------------------------------------------------------------

    def _target(self, text: str | None) -> Scope:
        if not text:
            raise InvalidInput(
                "target: name where the person belongs: org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID"
            )
        try:
            return self.tenancy.resolve(text, kinds=MEMBERSHIP_KINDS)
        except InvalidInput as err:
            raise InvalidInput(f"target: {err}") from None
        except NotFound as err:
            raise NotFound(f"target: {err}") from None

    def _unreachable(self, held: set[str], project_ids: set[str]) -> list[str]:
        """Of ``project_ids``, those no membership in ``held`` reaches (through the project, its team or its org)."""
        lost = []
        for project_id in sorted(project_ids):
            chain = self.tenancy.chain(project_id)
            if chain is None or not held & {chain.project_id, chain.team_id, chain.org_id}:
                lost.append(project_id)
        return lost

    async def _keyed_projects(self, user_id: str) -> set[str]:
        """The projects the person holds keys in that are not revoked."""
        keys = await self.access.list_keys("api")
        return {k.project_id for k in keys if k.user_id == user_id and k.project_id and k.revoked_at is None}


__all__ = ["MEMBERSHIP_KINDS", "Memberships"]
