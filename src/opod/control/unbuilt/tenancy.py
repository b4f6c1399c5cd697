"""Tenancy, people, sign-in and quotas: routed to the spec's letter, each answering 501 until its area is built."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from opod.contract.admin.common import Removed
from opod.contract.admin.tenancy import (
    AuthView,
    LDAPTestRequest,
    LDAPTestView,
    MembershipRequest,
    OrgView,
    QuotaRequest,
    QuotaSet,
    QuotaView,
    SecretRequest,
    TenancyChangeRequest,
    TenancyCreateRequest,
    TenancyItem,
    UserView,
)
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/auth", operation_id="getAuth", tags=["auth"], response_model=AuthView)
    async def get_auth() -> AuthView:
        raise not_built("sign-in")

    @api.post("/api/v1/auth/ldap/test", operation_id="postAuthLdapTest", tags=["auth"], response_model=LDAPTestView)
    async def post_auth_ldap_test(body: LDAPTestRequest) -> LDAPTestView:
        raise not_built("sign-in")

    @api.put("/api/v1/auth/secrets/{name}", operation_id="putAuthSecretsName", tags=["auth"], response_model=dict[str, str])
    async def put_auth_secrets_name(name: str, body: SecretRequest) -> dict[str, str]:
        raise not_built("sign-in")

    @api.get("/api/v1/orgs", operation_id="getOrgs", tags=["orgs"], response_model=list[OrgView])
    async def get_orgs() -> list[OrgView]:
        raise not_built("tenancy")

    @api.post("/api/v1/orgs", operation_id="postOrgs", tags=["orgs"], response_model=TenancyItem, status_code=201)
    async def post_orgs(body: TenancyCreateRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.patch("/api/v1/orgs/{id}", operation_id="patchOrgsId", tags=["orgs"], response_model=TenancyItem)
    async def patch_orgs_id(id: str, body: TenancyChangeRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.delete("/api/v1/orgs/{id}", operation_id="deleteOrgsId", tags=["orgs"], response_model=dict[str, Any])
    async def delete_orgs_id(id: str) -> dict[str, Any]:
        raise not_built("tenancy")

    @api.post("/api/v1/projects", operation_id="postProjects", tags=["projects"], response_model=TenancyItem, status_code=201)
    async def post_projects(body: TenancyCreateRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.patch("/api/v1/projects/{id}", operation_id="patchProjectsId", tags=["projects"], response_model=TenancyItem)
    async def patch_projects_id(id: str, body: TenancyChangeRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.delete("/api/v1/projects/{id}", operation_id="deleteProjectsId", tags=["projects"], response_model=dict[str, Any])
    async def delete_projects_id(id: str) -> dict[str, Any]:
        raise not_built("tenancy")

    @api.get("/api/v1/quotas", operation_id="getQuotas", tags=["quotas"], response_model=list[QuotaView])
    async def get_quotas() -> list[QuotaView]:
        raise not_built("quotas")

    @api.put("/api/v1/quotas", operation_id="putQuotas", tags=["quotas"], response_model=QuotaSet)
    async def put_quotas(body: QuotaRequest) -> QuotaSet:
        raise not_built("quotas")

    @api.delete("/api/v1/quotas/{scope}", operation_id="deleteQuotasScope", tags=["quotas"], response_model=Removed)
    async def delete_quotas_scope(scope: str) -> Removed:
        raise not_built("quotas")

    @api.post("/api/v1/teams", operation_id="postTeams", tags=["teams"], response_model=TenancyItem, status_code=201)
    async def post_teams(body: TenancyCreateRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.patch("/api/v1/teams/{id}", operation_id="patchTeamsId", tags=["teams"], response_model=TenancyItem)
    async def patch_teams_id(id: str, body: TenancyChangeRequest) -> TenancyItem:
        raise not_built("tenancy")

    @api.delete("/api/v1/teams/{id}", operation_id="deleteTeamsId", tags=["teams"], response_model=dict[str, Any])
    async def delete_teams_id(id: str) -> dict[str, Any]:
        raise not_built("tenancy")

    @api.get("/api/v1/users", operation_id="getUsers", tags=["users"], response_model=list[UserView])
    async def get_users(state: str | None = None) -> list[UserView]:
        raise not_built("people")

    @api.get("/api/v1/users/{id}", operation_id="getUsersId", tags=["users"], response_model=UserView)
    async def get_users_id(id: str) -> UserView:
        raise not_built("people")

    @api.post("/api/v1/users/{id}/memberships", operation_id="postUsersIdMemberships", tags=["users"], response_model=UserView)
    async def post_users_id_memberships(id: str, body: MembershipRequest) -> UserView:
        raise not_built("people")

    @api.delete("/api/v1/users/{id}/memberships", operation_id="deleteUsersIdMemberships", tags=["users"], response_model=UserView)
    async def delete_users_id_memberships(id: str, body: MembershipRequest) -> UserView:
        raise not_built("people")

    return api
