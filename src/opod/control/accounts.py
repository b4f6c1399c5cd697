"""``/api/v1/accounts`` (opod's own): local accounts, as an admin makes them and resets their passwords.

The first admin is made here with the admin key (``opod ctl users add EMAIL --role admin``, on the
leader's machine); from then on, admins sign in at ``/signin``. The rules (a password's length,
argon2id, sessions ended by a reset or a disabled account) are :class:`opod.access.signin.SignIn`'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.access.members import Memberships
from opod.access.signin import SignIn
from opod.contract.admin.accounts import AccountChange, AccountRequest, PasswordRequest, PasswordSet
from opod.contract.admin.tenancy import UserView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.control.user_views import user_view


def router(signin: SignIn, members: Memberships) -> APIRouter:
    api = SpecRouter()

    @api.post(
        "/api/v1/accounts", operation_id="postAccounts", tags=[EXTENSION_TAG], response_model=UserView, status_code=201
    )
    async def post_accounts(body: AccountRequest, draft: AuditDraft = Depends(audit_draft)) -> UserView:
        draft.body = {"email": body.email, "name": body.name, "role": body.role}  # never the password
        person = await signin.create_account(
            body.email or "", body.name or "", body.password or "", role=body.role or "", audit=draft
        )
        return user_view(members, person)

    @api.put(
        "/api/v1/accounts/{id}/password",
        operation_id="putAccountsIdPassword",
        tags=[EXTENSION_TAG],
        response_model=PasswordSet,
    )
    async def put_accounts_id_password(
        id: str, body: PasswordRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> PasswordSet:
        draft.body = {}
        person = members.user(id)
        at = await signin.set_password(person.id, body.password or "", audit=draft)
        return PasswordSet(id=person.id, updated_at=at)

    @api.put("/api/v1/accounts/{id}", operation_id="putAccountsId", tags=[EXTENSION_TAG], response_model=UserView)
    async def put_accounts_id(id: str, body: AccountChange, draft: AuditDraft = Depends(audit_draft)) -> UserView:
        person = members.user(id)
        changed = await signin.change_account(person.id, role=body.role, state=body.state, audit=draft)
        return user_view(members, changed)

    return api
