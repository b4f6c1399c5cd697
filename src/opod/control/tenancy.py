"""``/api/v1/orgs``, ``/teams``, ``/projects``: the tenancy tree.

A team goes in an organization and a project in a team, named by ID or by name or path (``in``:
``acme``, ``acme/ml``). PATCH renames, or moves a team to another organization or a project to
another team with everything under it; DELETE removes only an empty node. The rules are
:class:`opod.access.tenancy.Tenancy`'s: each change commits with its audit row, and the tree the
gateway reads changes right after the store.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from opod.access.tenancy import Tenancy
from opod.contract.admin.tenancy import (
    OrgView,
    ProjectView,
    TeamView,
    TenancyChangeRequest,
    TenancyCreateRequest,
    TenancyItem,
)
from opod.control.audit import AuditDraft, audit_draft
from opod.control.spec import SpecRouter
from opod.store.tenancy import Level, OrgRecord, ProjectRecord, TeamRecord


def item(record: OrgRecord | TeamRecord | ProjectRecord) -> TenancyItem:
    parent = getattr(record, "org_id", None) or getattr(record, "team_id", None)
    return TenancyItem(id=record.id, name=record.name, in_=parent)


def tree(tenancy: Tenancy, members: dict[str, int], keys: dict[str, tuple[int, int]]) -> list[OrgView]:
    """Every organization with its teams and their projects; counts of people are memberships held directly."""
    teams: dict[str, list[TeamRecord]] = {}
    for team in tenancy.teams:
        teams.setdefault(team.org_id, []).append(team)
    projects: dict[str, list[ProjectRecord]] = {}
    for project in tenancy.projects:
        projects.setdefault(project.team_id, []).append(project)

    def project_view(p: ProjectRecord) -> ProjectView:
        total, active = keys.get(p.id, (0, 0))
        return ProjectView(
            id=p.id,
            name=p.name,
            team=p.team_id,
            path=tenancy.path(p.id),
            users=members.get(p.id, 0),
            keys=total,
            active_keys=active,
        )

    return [
        OrgView(
            id=o.id,
            name=o.name,
            members=members.get(o.id, 0),
            teams=[
                TeamView(
                    id=t.id,
                    name=t.name,
                    org=o.id,
                    members=members.get(t.id, 0),
                    projects=[project_view(p) for p in projects.get(t.id, [])],
                )
                for t in teams.get(o.id, [])
            ],
        )
        for o in tenancy.orgs
    ]


def router(tenancy: Tenancy) -> APIRouter:
    api = SpecRouter()

    async def create(level: Level, body: TenancyCreateRequest, draft: AuditDraft) -> TenancyItem:
        return item(await tenancy.create(level, body.name, body.in_, audit=draft))

    async def change(level: Level, id: str, body: TenancyChangeRequest, draft: AuditDraft) -> TenancyItem:
        return item(await tenancy.change(level, id, name=body.name, parent=body.in_, audit=draft))

    async def remove(level: Level, id: str, draft: AuditDraft) -> dict[str, Any]:
        scope = await tenancy.delete(level, id, audit=draft)
        return {"id": scope.id, "deleted": True}

    @api.get("/api/v1/orgs", operation_id="getOrgs", tags=["orgs"], response_model=list[OrgView])
    async def get_orgs() -> list[OrgView]:
        return tree(tenancy, *await tenancy.counts())

    @api.post("/api/v1/orgs", operation_id="postOrgs", tags=["orgs"], response_model=TenancyItem, status_code=201)
    async def post_orgs(body: TenancyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> TenancyItem:
        return await create("org", body, draft)

    @api.patch("/api/v1/orgs/{id}", operation_id="patchOrgsId", tags=["orgs"], response_model=TenancyItem)
    async def patch_orgs_id(
        id: str, body: TenancyChangeRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> TenancyItem:
        return await change("org", id, body, draft)

    @api.delete("/api/v1/orgs/{id}", operation_id="deleteOrgsId", tags=["orgs"], response_model=dict[str, Any])
    async def delete_orgs_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await remove("org", id, draft)

    @api.post(
        "/api/v1/projects", operation_id="postProjects", tags=["projects"], response_model=TenancyItem, status_code=201
    )
    async def post_projects(body: TenancyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> TenancyItem:
        return await create("project", body, draft)

    @api.patch("/api/v1/projects/{id}", operation_id="patchProjectsId", tags=["projects"], response_model=TenancyItem)
    async def patch_projects_id(
        id: str, body: TenancyChangeRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> TenancyItem:
        return await change("project", id, body, draft)

    @api.delete(
        "/api/v1/projects/{id}", operation_id="deleteProjectsId", tags=["projects"], response_model=dict[str, Any]
    )
    async def delete_projects_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await remove("project", id, draft)

    @api.post("/api/v1/teams", operation_id="postTeams", tags=["teams"], response_model=TenancyItem, status_code=201)
    async def post_teams(body: TenancyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> TenancyItem:
        return await create("team", body, draft)

    @api.patch("/api/v1/teams/{id}", operation_id="patchTeamsId", tags=["teams"], response_model=TenancyItem)
    async def patch_teams_id(
        id: str, body: TenancyChangeRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> TenancyItem:
        return await change("team", id, body, draft)

    @api.delete("/api/v1/teams/{id}", operation_id="deleteTeamsId", tags=["teams"], response_model=dict[str, Any])
    async def delete_teams_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await remove("team", id, draft)

    return api
