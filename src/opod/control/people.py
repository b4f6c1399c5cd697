"""``/api/v1/users`` (people and their memberships) and ``/api/v1/auth`` (how people sign in, and its secrets).

People arrive through SCIM provisioning (:mod:`opod.control.scim`); here an operator sees them
and puts them in organizations, teams and projects. Taking someone out of a place revokes their
keys in the projects they no longer reach through any membership. ``PUT /auth/secrets/{name}``
keeps a secret the settings name as ``store:auth/NAME``; no answer and no audit row holds its value.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.access.people import People
from opod.access.scopes import Scope, id_kind
from opod.contract.admin.tenancy import AuthView, MembershipRequest, MembershipView, SecretRequest, UserView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.context import ControlContext, ControlError
from opod.control.spec import SpecRouter
from opod.store.errors import InvalidInput, NotFound
from opod.store.offloop import run_sync
from opod.store.people import UserRecord
from opod.store.schema import MEMBER_ROLES, USER_STATES

AUTH_SECRETS = ("ldap-bind", "oidc-client-secret", "scim-token")
"""The secrets ``PUT /auth/secrets/{name}`` keeps, each as ``auth/NAME``."""
SCIM_TOKEN_SECRET = "auth/scim-token"
MEMBERSHIP_KINDS = ("org", "team", "project")


def secret_reference(name: str) -> str:
    """How the settings name a stored secret."""
    return f"store:auth/{name}"


def scim_secret_name(ctx: ControlContext) -> str:
    """The stored secret SCIM's bearer token is: ``auth/scim-token``, unless the settings name another (``store:NAME``)."""
    named = ctx.settings.current.auth.scim_token
    return named.removeprefix("store:") if named.startswith("store:") else SCIM_TOKEN_SECRET


def target_path(ctx: ControlContext, target: str) -> str:
    """``acme``, ``acme/ml`` or ``acme/ml/chat`` for an org, team or project id; the id itself once it is gone."""
    kind = id_kind(target)
    if kind is None:
        return target
    return ctx.tenancy.scope_path(Scope(kind, target))


def user_view(ctx: ControlContext, people: People, user: UserRecord) -> UserView:
    memberships = [
        MembershipView(target=m.target, path=target_path(ctx, m.target), role=m.role, at=m.at, by=m.by or None)
        for m in people.memberships(user.id)
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


def find_user(people: People, id_or_email: str) -> UserRecord:
    user = people.user(id_or_email)
    if user is None:
        raise ControlError(404, f"no person {id_or_email!r} (an ID usr_… or an email); GET /api/v1/users lists them")
    return user


def resolve_target(ctx: ControlContext, text: str | None) -> Scope:
    if not text:
        raise ControlError(
            400, "target: name where the person belongs: org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID"
        )
    try:
        return ctx.tenancy.resolve(text, kinds=MEMBERSHIP_KINDS)
    except InvalidInput as err:
        raise ControlError(400, f"target: {err}") from None
    except NotFound as err:
        raise ControlError(404, f"target: {err}") from None


def unreachable_projects(ctx: ControlContext, held: set[str], project_ids: set[str]) -> list[str]:
    """Of ``project_ids``, those no membership in ``held`` reaches (through the project, its team or its org)."""
    lost = []
    for project_id in sorted(project_ids):
        chain = ctx.tenancy.chain(project_id)
        if chain is None or not held & {chain.project_id, chain.team_id, chain.org_id}:
            lost.append(project_id)
    return lost


async def keyed_projects(ctx: ControlContext, user_id: str) -> set[str]:
    """The projects the person holds keys in that are not revoked."""
    keys = await run_sync(ctx.store.list_keys, "api")
    return {k.project_id for k in keys if k.user_id == user_id and k.project_id and k.revoked_at is None}


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/users", operation_id="getUsers", tags=["users"], response_model=list[UserView])
    async def get_users(state: str | None = None) -> list[UserView]:
        people = ctx.people
        if state is not None and state not in USER_STATES:
            raise ControlError(
                400, f"state: {state!r} is not one of {', '.join(USER_STATES)}; leave it out for everyone"
            )
        return [user_view(ctx, people, u) for u in people.users(state)]

    @api.get("/api/v1/users/{id}", operation_id="getUsersId", tags=["users"], response_model=UserView)
    async def get_users_id(id: str) -> UserView:
        people = ctx.people
        return user_view(ctx, people, find_user(people, id))

    @api.post(
        "/api/v1/users/{id}/memberships", operation_id="postUsersIdMemberships", tags=["users"], response_model=UserView
    )
    async def post_users_id_memberships(
        id: str, body: MembershipRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> UserView:
        people = ctx.people
        user = find_user(people, id)
        role = body.role or "member"
        if role not in MEMBER_ROLES:
            raise ControlError(400, f"role: {role!r} is not one of {', '.join(MEMBER_ROLES)} (member when left out)")
        scope = resolve_target(ctx, body.target)
        detail = {"target": scope.text, "path": target_path(ctx, scope.id), "role": role}
        with draft.commit(target=f"user:{user.id}", detail=detail) as row:
            await people.join(user.id, scope.id, role=role, by=draft.actor, audit=row)
        return user_view(ctx, people, user)

    @api.delete(
        "/api/v1/users/{id}/memberships",
        operation_id="deleteUsersIdMemberships",
        tags=["users"],
        response_model=UserView,
    )
    async def delete_users_id_memberships(
        id: str, body: MembershipRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> UserView:
        people = ctx.people
        user = find_user(people, id)
        scope = resolve_target(ctx, body.target)
        if scope.id not in {m.target for m in people.memberships(user.id)}:
            raise ControlError(
                404,
                f"target: {user.email} is not a member of {scope.text}; GET /api/v1/users/{user.id} says where they are",
            )
        left = {m.target for m in people.memberships(user.id)} - {scope.id}
        losing = unreachable_projects(ctx, left, await keyed_projects(ctx, user.id))
        detail = {
            "target": scope.text,
            "path": target_path(ctx, scope.id),
            "revokes_keys_in": [target_path(ctx, p) for p in losing],
        }
        with draft.commit(target=f"user:{user.id}", detail=detail) as row:
            await people.leave(user.id, scope.id, audit=row)  # the keys in projects no longer reached go with it
        return user_view(ctx, people, user)

    @api.get("/api/v1/auth", operation_id="getAuth", tags=["auth"], response_model=AuthView)
    async def get_auth() -> AuthView:
        token = await run_sync(ctx.store.secret_info, scim_secret_name(ctx))
        return AuthView(signup_open=False, scim=token is not None)

    @api.put(
        "/api/v1/auth/secrets/{name}", operation_id="putAuthSecretsName", tags=["auth"], response_model=dict[str, str]
    )
    async def put_auth_secrets_name(
        name: str, body: SecretRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> dict[str, str]:
        if name not in AUTH_SECRETS:
            raise ControlError(400, f"name: {name!r} is not a secret opod keeps; use one of {', '.join(AUTH_SECRETS)}")
        if not body.value:
            raise ControlError(400, 'value: send the secret as {"value": "..."}; it is stored, never shown again')
        reference = secret_reference(name)
        with draft.commit(target=f"secret:auth/{name}", detail={"name": name, "reference": reference}) as row:
            record = await run_sync(ctx.store.put_secret, f"auth/{name}", body.value, by=draft.actor, audit=row)
        return {"name": name, "reference": reference, "updated_at": record.updated_at.isoformat()}

    return api
