"""People and their memberships in memory, and the one writer that changes them (store first, then memory).

The management API (``/api/v1/users``) and SCIM provisioning (``/scim/v2``) change people only
through :class:`People`; :class:`opod.access.tenancy.Tenancy` answers ``user(...)`` and
``user_active(...)`` from it. A person disabled here has their keys refused on ``/v1`` from the
next request on (``AccessService.suspend_user``), and reinstated when they are active again; at
start-up the disabled people's keys are refused before the first request.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from opod.access.service import AccessService
from opod.store import Store
from opod.store.audit import AuditRow
from opod.store.following import StaleRead
from opod.store.offloop import run_sync
from opod.store.people import MembershipRecord, MembershipsMatched, Pair, UserRecord, membership_plan
from opod.store.scim import GroupGrants, ScimGroupRecord, ScimUserRecord

log = logging.getLogger("opod.access")

DISABLED = "disabled"


class People:
    """The people table in memory; every change goes to the store first, in one transaction with its audit row."""

    def __init__(
        self,
        store: Store,
        access: AccessService,
        users: Collection[UserRecord] = (),
        memberships: Collection[MembershipRecord] = (),
    ) -> None:
        """Use :meth:`load`; this takes what the store holds already."""
        self._store = store
        self._access = access
        self._users: dict[str, UserRecord] = {}
        self._by_email: dict[str, str] = {}
        self._memberships: dict[str, dict[str, MembershipRecord]] = {}
        self._changes = 0
        """Bumped by every change made here, so a read of the store that overlapped one is not applied over it."""
        self._fill(users, memberships)

    @classmethod
    def load(cls, store: Store, access: AccessService) -> People:
        """Read everyone and their memberships (at start-up, off the loop); disabled people's keys are refused from now."""
        people = cls(store, access, store.list_users(), store.list_memberships())
        for user in people._users.values():
            if user.state == DISABLED:
                access.suspend_user(user.id)
        return people

    # --- reads (memory only) ------------------------------------------------------------------

    def user(self, id_or_email: str) -> UserRecord | None:
        """A person by id (``usr_…``) or by email, in any case."""
        found = self._users.get(id_or_email)
        if found is not None:
            return found
        user_id = self._by_email.get(id_or_email.strip().lower())
        return None if user_id is None else self._users.get(user_id)

    def user_active(self, user_id: str) -> bool:
        """Whether this person's keys may be used: they exist and are not disabled."""
        user = self._users.get(user_id)
        return user is not None and user.state != DISABLED

    def users(self, state: str | None = None) -> list[UserRecord]:
        """Everyone (oldest first), or those in ``state``."""
        return [
            u
            for u in sorted(self._users.values(), key=lambda u: (u.created_at, u.id))
            if state is None or u.state == state
        ]

    def memberships(self, user_id: str) -> list[MembershipRecord]:
        return sorted(self._memberships.get(user_id, {}).values(), key=lambda m: (m.at, m.target))

    def members(self, target: str) -> list[MembershipRecord]:
        """Who belongs to ``target`` (an org, team or project id)."""
        found = [m for held in self._memberships.values() if (m := held.get(target)) is not None]
        return sorted(found, key=lambda m: (m.at, m.user_id))

    def targets(self, user_id: str) -> list[str]:
        """The org, team and project ids this person holds a membership on."""
        return sorted(self._memberships.get(user_id, {}))

    # --- changes (store, then memory) ---------------------------------------------------------

    async def create(
        self,
        *,
        email: str,
        name: str = "",
        state: str = "active",
        role: str = "",
        external_id: str = "",
        id: str | None = None,
        password_hash: str = "",
        audit: AuditRow | None = None,
    ) -> UserRecord:
        """A new person (``id`` fresh unless given, so an audit row can name it before it exists); with a local
        password when ``password_hash`` is given, in the same transaction."""
        record = await run_sync(
            self._store.create_user,
            email=email,
            name=name,
            state=state,
            role=role,
            external_id=external_id,
            id=id,
            password_hash=password_hash,
            audit=audit,
        )
        self._changes += 1
        self._put(record)
        if record.state == DISABLED:
            self._access.suspend_user(record.id)
        return record

    async def update(
        self,
        user_id: str,
        *,
        email: str | None = None,
        name: str | None = None,
        state: str | None = None,
        role: str | None = None,
        external_id: str | None = None,
        last_login_at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> UserRecord:
        """Change the fields given; a person who becomes disabled has their keys refused at once, reinstated when active."""
        record = await run_sync(
            self._store.update_user,
            user_id,
            email=email,
            name=name,
            state=state,
            role=role,
            external_id=external_id,
            last_login_at=last_login_at,
            audit=audit,
        )
        self._changes += 1
        self._put(record)
        self._follow_state(record)
        return record

    async def join(
        self, user_id: str, target: str, *, role: str, by: str, audit: AuditRow | None = None
    ) -> MembershipRecord:
        """Put a person in ``target``, or change their role there."""
        record = await run_sync(self._store.set_membership, user_id, target, role=role, by=by, audit=audit)
        self._changes += 1
        self._memberships.setdefault(user_id, {})[target] = record
        return record

    async def leave(self, user_id: str, target: str, *, audit: AuditRow | None = None) -> bool:
        """Take a person out of ``target``, and revoke their keys in the projects they no longer reach, in one
        transaction with ``audit``; False when they were not in it."""
        change = await run_sync(self._store.leave, user_id, target, audit=audit)
        self._changes += 1
        self._memberships.get(user_id, {}).pop(target, None)
        self._access.revoked_in_store(change.revoked)
        return bool(change.removed)

    async def match_memberships(
        self,
        user_id: str,
        wanted: Mapping[str, str],
        *,
        targets: Collection[str],
        by: str,
        audit: AuditRow | None = None,
    ) -> MembershipsMatched:
        """The person's memberships in ``targets`` (the places a provider's groups decide) made ``wanted``
        (target → role), those not wanted taken out with the keys that reach nowhere else, in one transaction with
        ``audit``; nothing is written (no row either) when they are so already."""
        pairs: dict[Pair, str] = {(user_id, target): role for target, role in wanted.items()}
        held = [m for m in self.memberships(user_id) if m.target in targets or m.target in wanted]
        setting, removing = membership_plan(held, pairs, owner=None)
        if not setting and not removing:
            return MembershipsMatched()
        change = await run_sync(
            self._store.match_memberships, pairs, targets=targets, users=[user_id], by=by, audit=audit
        )
        await self._granted(change)
        return change

    # --- SCIM provisioning: people with their resource, groups and the memberships they grant ----

    async def provision(
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
        audit: AuditRow | None = None,
    ) -> tuple[UserRecord, ScimUserRecord]:
        """Write a person SCIM provisions and their resource (``create``: a new one, or the unprovisioned person who
        holds ``email`` taken over); a person who becomes disabled has their keys refused at once."""
        person, kept = await run_sync(
            self._store.provision_user,
            user_id=user_id,
            user_name=user_name,
            email=email,
            name=name,
            state=state,
            external_id=external_id,
            document=document,
            create=create,
            audit=audit,
        )
        self._changes += 1
        self._put(person)
        self._follow_state(person)
        return person, kept

    async def unprovision(
        self, user_id: str, *, grants: GroupGrants, audit: AuditRow | None = None
    ) -> MembershipsMatched:
        """SCIM's DELETE: the person disabled and out of every group, with what the groups granted them taken back."""
        person, change = await run_sync(self._store.unprovision_user, user_id, grants=grants, audit=audit)
        self._put(person)
        self._follow_state(person)
        await self._granted(change)
        return change

    async def put_group(
        self,
        group_id: str,
        *,
        display_name: str,
        external_id: str,
        document: Mapping[str, Any],
        members: Mapping[str, str],
        create: bool,
        grants: GroupGrants,
        audit: AuditRow | None = None,
    ) -> tuple[ScimGroupRecord, MembershipsMatched]:
        """Create or replace a SCIM group whole; the memberships it grants follow in the same transaction."""
        group, change = await run_sync(
            self._store.put_scim_group,
            group_id,
            display_name=display_name,
            external_id=external_id,
            document=document,
            members=members,
            create=create,
            grants=grants,
            audit=audit,
        )
        await self._granted(change)
        return group, change

    async def delete_group(
        self, group_id: str, *, grants: GroupGrants, audit: AuditRow | None = None
    ) -> MembershipsMatched:
        change = await run_sync(self._store.delete_scim_group, group_id, grants=grants, audit=audit)
        await self._granted(change)
        return change

    async def sync_grants(self, grants: GroupGrants, *, audit: AuditRow | None = None) -> MembershipsMatched:
        """Every membership SCIM groups grant brought in line with ``grants`` (after the settings' mapping changed)."""
        change = await run_sync(self._store.sync_scim_grants, grants, audit=audit)
        await self._granted(change)
        return change

    async def _granted(self, change: MembershipsMatched) -> None:
        """Memory after memberships were matched: the targets' memberships read again, the lost keys refused."""
        self._changes += 1
        self._access.revoked_in_store(change.revoked)
        for target in change.targets:
            fresh = await run_sync(self._store.list_memberships, None, target)
            for held in self._memberships.values():
                held.pop(target, None)
            for membership in fresh:
                self._memberships.setdefault(membership.user_id, {})[target] = membership

    # --- following other leaders ---------------------------------------------------------------

    async def follow(self) -> None:
        """Read everyone again and apply what changed (a disabled person's keys refused, a reinstated one's back).
        The leader's :class:`~opod.store.following.Following` calls it when the store changed: what another
        leader changed is in force here within 2 s.

        Raises :class:`~opod.store.following.StaleRead` when a change made here overlapped the read, which may
        be older than it: the read is dropped and made again at the next look."""
        before = self._changes
        users = await run_sync(self._store.list_users)
        memberships = await run_sync(self._store.list_memberships)
        if self._changes != before:
            raise StaleRead("people changed here during the read")
        was = {u.id: u.state for u in self._users.values()}
        self._users, self._by_email, self._memberships = {}, {}, {}
        self._fill(users, memberships)
        for user in users:
            if was.get(user.id, "active") != user.state and DISABLED in (was.get(user.id), user.state):
                self._follow_state(user)

    # --- inside -------------------------------------------------------------------------------

    def _fill(self, users: Collection[UserRecord], memberships: Collection[MembershipRecord]) -> None:
        for user in users:
            self._put(user)
        for membership in memberships:
            self._memberships.setdefault(membership.user_id, {})[membership.target] = membership

    def _put(self, user: UserRecord) -> None:
        old = self._users.get(user.id)
        if old is not None:
            self._by_email.pop(old.email.lower(), None)
        self._users[user.id] = user
        self._by_email[user.email.lower()] = user.id

    def _follow_state(self, user: UserRecord) -> None:
        if user.state == DISABLED:
            self._access.suspend_user(user.id)
        else:
            self._access.reinstate_user(user.id)


__all__ = ["People"]
