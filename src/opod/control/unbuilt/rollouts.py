"""Model rollouts: serving from a registry, adapters, canaries, evaluations, updates, fallbacks, origins: routed to the spec's letter, each answering 501 until its area is built."""

from __future__ import annotations

from fastapi import APIRouter, Query

from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import (
    AdaptersRequest,
    CanaryPercentRequest,
    CheckRequest,
    EvalGateRequest,
    EvalGateView,
    EvalLive,
    EvalRequest,
    EvalSuiteInfo,
    FallbacksRequest,
    FallbacksView,
    ModelserveCanaryView,
    ModelserveChange,
    ModelserveJob,
    ModelservePlan,
    ModelserveRequest,
    ModelserveUpdateInfo,
    OriginRequest,
    OriginView,
    Result,
)
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.get(
        "/api/v1/canaries", operation_id="getCanaries", tags=["canaries"], response_model=list[ModelserveCanaryView]
    )
    async def get_canaries() -> list[ModelserveCanaryView]:
        raise not_built("model rollouts")

    @api.get("/api/v1/eval/runs", operation_id="getEvalRuns", tags=["eval"], response_model=list[EvalLive])
    async def get_eval_runs(model: str | None = None, limit: int | None = None) -> list[EvalLive]:
        raise not_built("evaluations")

    @api.get("/api/v1/eval/runs/{id}", operation_id="getEvalRunsId", tags=["eval"], response_model=EvalLive)
    async def get_eval_runs_id(id: str) -> EvalLive:
        raise not_built("evaluations")

    @api.get("/api/v1/eval/suites", operation_id="getEvalSuites", tags=["eval"], response_model=list[EvalSuiteInfo])
    async def get_eval_suites() -> list[EvalSuiteInfo]:
        raise not_built("evaluations")

    @api.get("/api/v1/jobs", operation_id="getJobs", tags=["jobs"], response_model=list[ModelserveJob])
    async def get_jobs() -> list[ModelserveJob]:
        raise not_built("model rollouts")

    @api.get("/api/v1/jobs/{id}", operation_id="getJobsId", tags=["jobs"], response_model=ModelserveJob)
    async def get_jobs_id(id: str) -> ModelserveJob:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/serve",
        operation_id="postModelsServe",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_serve(body: ModelserveRequest) -> ModelserveJob:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/adapters",
        operation_id="postModelsNameAdapters",
        tags=["models"],
        response_model=AdaptersRequest,
    )
    async def post_models_name_adapters(name: str, body: AdaptersRequest) -> AdaptersRequest:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/canary",
        operation_id="postModelsNameCanary",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_canary(name: str, body: CatalogCanary) -> ModelserveJob:
        raise not_built("model rollouts")

    @api.put("/api/v1/models/{name}/canary", operation_id="putModelsNameCanary", tags=["models"], response_model=Result)
    async def put_models_name_canary(name: str, body: CanaryPercentRequest) -> Result:
        raise not_built("model rollouts")

    @api.delete(
        "/api/v1/models/{name}/canary", operation_id="deleteModelsNameCanary", tags=["models"], response_model=Result
    )
    async def delete_models_name_canary(name: str) -> Result:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/eval",
        operation_id="postModelsNameEval",
        tags=["models"],
        response_model=EvalLive,
        status_code=202,
    )
    async def post_models_name_eval(name: str, body: EvalRequest) -> EvalLive:
        raise not_built("model rollouts")

    @api.put(
        "/api/v1/models/{name}/eval-gate",
        operation_id="putModelsNameEvalGate",
        tags=["models"],
        response_model=EvalGateView,
    )
    async def put_models_name_eval_gate(name: str, body: EvalGateRequest) -> EvalGateView:
        raise not_built("model rollouts")

    @api.delete(
        "/api/v1/models/{name}/eval-gate",
        operation_id="deleteModelsNameEvalGate",
        tags=["models"],
        response_model=EvalGateView,
    )
    async def delete_models_name_eval_gate(name: str) -> EvalGateView:
        raise not_built("model rollouts")

    @api.put(
        "/api/v1/models/{name}/fallbacks",
        operation_id="putModelsNameFallbacks",
        tags=["models"],
        response_model=FallbacksView,
    )
    async def put_models_name_fallbacks(name: str, body: FallbacksRequest) -> FallbacksView:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/origin", operation_id="postModelsNameOrigin", tags=["models"], response_model=OriginView
    )
    async def post_models_name_origin(name: str, body: OriginRequest) -> OriginView:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/promote",
        operation_id="postModelsNamePromote",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_promote(name: str, body: ModelserveChange | None = None) -> ModelserveJob:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/rollback", operation_id="postModelsNameRollback", tags=["models"], response_model=Result
    )
    async def post_models_name_rollback(name: str) -> Result:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/models/{name}/update",
        operation_id="postModelsNameUpdate",
        tags=["models"],
        response_model=ModelserveJob,
        status_code=202,
    )
    async def post_models_name_update(name: str, body: ModelserveChange | None = None) -> ModelserveJob:
        raise not_built("model rollouts")

    @api.get("/api/v1/plan", operation_id="getPlan", tags=["plan"], response_model=ModelservePlan)
    async def get_plan(repo: str = Query(), format: str | None = None, context: int | None = None) -> ModelservePlan:
        raise not_built("model rollouts")

    @api.get("/api/v1/updates", operation_id="getUpdates", tags=["updates"], response_model=list[ModelserveUpdateInfo])
    async def get_updates() -> list[ModelserveUpdateInfo]:
        raise not_built("model rollouts")

    @api.post(
        "/api/v1/updates/check",
        operation_id="postUpdatesCheck",
        tags=["updates"],
        response_model=list[ModelserveUpdateInfo],
    )
    async def post_updates_check(body: CheckRequest | None = None) -> list[ModelserveUpdateInfo]:
        raise not_built("model rollouts")

    return api
