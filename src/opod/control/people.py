"""``/api/v1/users`` (people and their memberships) and ``/api/v1/auth`` (how people sign in, and its secrets).

People arrive through SCIM provisioning (:mod:`opod.control.scim`); here an operator sees them and
puts them in organizations, teams and projects (the rules: :class:`opod.access.members.Memberships`).
``PUT /auth/secrets/{name}`` keeps a secret the settings name as ``store:auth/NAME``
(:class:`opod.access.secrets.AuthSecrets`); no answer and no audit row holds its value.
``POST /auth/ldap/test`` tries an ``auth.ldap`` block against its directory, changing nothing
(:class:`opod.access.directory.Directory`); the listener audits the call.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.access.directory import Directory
from opod.access.members import Memberships
from opod.access.oidc import oidc_view
from opod.access.secrets import AuthSecrets, secret_reference
from opod.access.signin import SignIn
from opod.contract.admin.tenancy import (
    AuthView,
    LDAPTestRequest,
    LDAPTestView,
    MembershipRequest,
    SecretRequest,
    UserView,
)
from opod.control.audit import AuditDraft, audit_draft
from opod.control.spec import SpecRouter
from opod.control.user_views import user_view as shown
from opod.store.people import UserRecord


def router(members: Memberships, secrets: AuthSecrets, directory: Directory, signin: SignIn) -> APIRouter:
    api = SpecRouter()

    def user_view(user: UserRecord) -> UserView:
        return shown(members, user)

    @api.get("/api/v1/users", operation_id="getUsers", tags=["users"], response_model=list[UserView])
    async def get_users(state: str | None = None) -> list[UserView]:
        return [user_view(u) for u in members.users(state)]

    @api.get("/api/v1/users/{id}", operation_id="getUsersId", tags=["users"], response_model=UserView)
    async def get_users_id(id: str) -> UserView:
        return user_view(members.user(id))

    @api.post(
        "/api/v1/users/{id}/memberships", operation_id="postUsersIdMemberships", tags=["users"], response_model=UserView
    )
    async def post_users_id_memberships(
        id: str, body: MembershipRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> UserView:
        return user_view(await members.join(id, body.target, body.role, audit=draft))

    @api.delete(
        "/api/v1/users/{id}/memberships",
        operation_id="deleteUsersIdMemberships",
        tags=["users"],
        response_model=UserView,
    )
    async def delete_users_id_memberships(
        id: str, body: MembershipRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> UserView:
        return user_view(await members.leave(id, body.target, audit=draft))

    @api.get("/api/v1/auth", operation_id="getAuth", tags=["auth"], response_model=AuthView)
    async def get_auth() -> AuthView:
        auth = secrets.settings.current.auth
        return AuthView(
            signup_open=signin.signup_open,
            scim=await secrets.scim_on(),
            base_url=signin.base_url or None,
            oidc=oidc_view(auth),
            ldap=directory.view() if directory.configured() else None,
        )

    @api.post("/api/v1/auth/ldap/test", operation_id="postAuthLdapTest", tags=["auth"], response_model=LDAPTestView)
    async def post_auth_ldap_test(body: LDAPTestRequest) -> LDAPTestView:
        return await directory.test(body.settings or "", body.password)

    @api.put(
        "/api/v1/auth/secrets/{name}", operation_id="putAuthSecretsName", tags=["auth"], response_model=dict[str, str]
    )
    async def put_auth_secrets_name(
        name: str, body: SecretRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> dict[str, str]:
        record = await secrets.put(name, body.value, audit=draft)
        return {"name": name, "reference": secret_reference(name), "updated_at": record.updated_at.isoformat()}

    return api
