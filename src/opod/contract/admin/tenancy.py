"""Wire types of the management API's tenancy: organizations, teams, projects, people, sign-in, quotas, keys."""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from opod.contract.admin.base import ApiModel, ApiRequest


class OIDCView(ApiModel):
    issuer: str | None = None
    client_id: str | None = None
    label: str | None = None
    create_accounts: bool | None = None
    no_passwords: bool | None = None


class DirectorySyncView(ApiModel):
    at: datetime | None = None
    people: int | None = None
    accounts: int | None = None
    suspended: int | None = None
    reinstated: int | None = None
    roles_changed: int | None = None
    error: str | None = None


class LDAPView(ApiModel):
    urls: list[str] | None = None
    base_dn: str | None = None
    bind_dn: str | None = None
    label: str | None = None
    off: str | None = None
    last_sync: DirectorySyncView | None = None


class AuthView(ApiModel):
    signup_open: bool | None = None
    oidc: OIDCView | None = None
    ldap: LDAPView | None = None
    scim: bool | None = None
    base_url: str | None = None


class CheckView(ApiModel):
    step: str | None = None
    ok: bool | None = None
    detail: str | None = None


class KeyCreateRequest(ApiRequest):
    name: str | None = None
    project: str | None = None
    user: str | None = None
    band: str | None = None
    routing_profile: str | None = None
    expires_in: str | None = None


class KeyCreated(ApiModel):
    id: str | None = None
    name: str | None = None
    prefix: str | None = None
    project: str | None = None
    project_path: str | None = None
    user: str | None = None
    user_email: str | None = None
    band: str | None = None
    routing_profile: str | None = None
    state: str | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    secret: str | None = None


class KeyView(ApiModel):
    id: str | None = None
    name: str | None = None
    prefix: str | None = None
    project: str | None = None
    project_path: str | None = None
    user: str | None = None
    user_email: str | None = None
    band: str | None = None
    routing_profile: str | None = None
    state: str | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


class LDAPTestRequest(ApiRequest):
    settings: str | None = None
    password: str | None = None


class LDAPTestView(ApiModel):
    ok: bool | None = None
    checks: list[CheckView] | None = None


class MembershipRequest(ApiRequest):
    target: str | None = None
    role: str | None = None


class MembershipView(ApiModel):
    target: str | None = None
    path: str | None = None
    role: str | None = None
    at: datetime | None = None
    by: str | None = None


class ProjectView(ApiModel):
    id: str | None = None
    name: str | None = None
    team: str | None = None
    path: str | None = None
    users: int | None = None
    keys: int | None = None
    active_keys: int | None = None


class TeamView(ApiModel):
    id: str | None = None
    name: str | None = None
    org: str | None = None
    members: int | None = None
    projects: list[ProjectView] | None = None


class OrgView(ApiModel):
    id: str | None = None
    name: str | None = None
    members: int | None = None
    teams: list[TeamView] | None = None


class QuotaAmount(ApiModel):
    model_config = ConfigDict(title="quota.Amount")
    GPUs: int | None = None
    CPUCores: int | None = None
    MemoryGB: int | None = None


class StoreResources(ApiRequest):
    model_config = ConfigDict(title="store.Resources")
    gpus: int | None = None
    cpu_cores: int | None = None
    memory_gb: int | None = None


class QuotaRequest(ApiRequest):
    scope: str | None = None
    guarantee: StoreResources | None = None
    limit: StoreResources | None = None


class QuotaSet(ApiModel):
    scope: str | None = None


class QuotaView(ApiModel):
    scope: str | None = None
    name: str | None = None
    guarantee: StoreResources | None = None
    limit: StoreResources | None = None
    holds: QuotaAmount | None = None
    updated_by: str | None = None
    updated_at: datetime | None = None


class SecretRequest(ApiRequest):
    value: str | None = None


class TenancyChangeRequest(ApiRequest):
    name: str | None = None
    in_: str | None = Field(None, alias="in")


class TenancyCreateRequest(ApiRequest):
    name: str | None = None
    in_: str | None = Field(None, alias="in")


class TenancyItem(ApiModel):
    id: str | None = None
    name: str | None = None
    in_: str | None = Field(None, alias="in")


class UserView(ApiModel):
    id: str | None = None
    email: str | None = None
    name: str | None = None
    state: str | None = None
    role: str | None = None
    memberships: list[MembershipView] | None = None
    created_at: datetime | None = None
    last_login_at: datetime | None = None
