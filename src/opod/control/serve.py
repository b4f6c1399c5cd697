"""``/api/v1/plan``, ``/api/v1/models/serve`` and ``/api/v1/jobs``: a registry repository planned, served, followed.

Everything is the serving service's (:class:`~opod.control.serving.ServeJobs`); the handlers parse, call it, answer.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from opod.contract.admin.models import ModelserveJob, ModelservePlan, ModelserveRequest
from opod.control.audit import audit_draft
from opod.control.context import Serving
from opod.control.spec import SpecRouter
from opod.store.audit import AuditDraft


def router(jobs: Serving) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/plan", operation_id="getPlan", tags=["plan"], response_model=ModelservePlan)
    async def get_plan(repo: str = Query(), format: str | None = None, context: int | None = None) -> ModelservePlan:
        return await jobs.plan(repo, format, context)

    @api.post(
        "/api/v1/models/serve",
        operation_id="postModelsServe",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_serve(body: ModelserveRequest, draft: AuditDraft = Depends(audit_draft)) -> ModelserveJob:
        return await jobs.start(body, draft)

    @api.get("/api/v1/jobs", operation_id="getJobs", tags=["jobs"], response_model=list[ModelserveJob])
    async def get_jobs() -> list[ModelserveJob]:
        return await jobs.jobs()

    @api.get("/api/v1/jobs/{id}", operation_id="getJobsId", tags=["jobs"], response_model=ModelserveJob)
    async def get_jobs_id(id: str) -> ModelserveJob:
        return await jobs.job(id)

    return api
