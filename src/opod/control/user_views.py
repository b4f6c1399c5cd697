"""A person as the management API shows them (``UserView``): for ``/users`` and ``/accounts`` alike."""

from __future__ import annotations

from opod.access.members import Memberships
from opod.contract.admin.tenancy import MembershipView, UserView
from opod.store.people import UserRecord


def user_view(members: Memberships, user: UserRecord) -> UserView:
    memberships = [
        MembershipView(target=m.target, path=members.path(m.target), role=m.role, at=m.at, by=m.by or None)
        for m in members.memberships(user.id)
    ]
    return UserView(
        id=user.id,
        email=user.email,
        name=user.name or None,
        state=user.state,
        role=user.role or None,
        memberships=memberships,
        created_at=user.created_at,
        last_login_at=user.last_login_at,
    )
