"""Usage, request records, audit, settings, notifications, metrics and client jobs: routed to the spec's letter, each answering 501 until its area is built."""

from __future__ import annotations

from fastapi import APIRouter, Query

from opod.contract.admin.records import (
    JobView,
    MetricsRequest,
    MetricsResult,
    NotifyResult,
    ReplayRequest,
    ReplayView,
    RequestView,
    ScopeUsageView,
    SettingsRequest,
    SettingsRollbackRequest,
    SettingsView,
    StoreAuditEvent,
    StoreExportRow,
    StoreRequestBody,
)
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/audit", operation_id="getAudit", tags=["audit"], response_model=list[StoreAuditEvent])
    async def get_audit(
        since: str | None = None, limit: int | None = None, actor: str | None = None, contains: str | None = None
    ) -> list[StoreAuditEvent]:
        raise not_built("audit")

    @api.get("/api/v1/client-jobs", operation_id="getClientJobs", tags=["client-jobs"], response_model=list[JobView])
    async def get_client_jobs(status: str | None = None, limit: int | None = None) -> list[JobView]:
        raise not_built("client jobs")

    @api.get("/api/v1/client-jobs/{id}", operation_id="getClientJobsId", tags=["client-jobs"], response_model=JobView)
    async def get_client_jobs_id(id: str) -> JobView:
        raise not_built("client jobs")

    @api.post("/api/v1/client-jobs/{id}/cancel", operation_id="postClientJobsIdCancel", tags=["client-jobs"], response_model=JobView)
    async def post_client_jobs_id_cancel(id: str) -> JobView:
        raise not_built("client jobs")

    @api.post("/api/v1/metrics/range", operation_id="postMetricsRange", tags=["metrics"], response_model=MetricsResult)
    async def post_metrics_range(body: MetricsRequest) -> MetricsResult:
        raise not_built("metrics")

    @api.post("/api/v1/notify/test", operation_id="postNotifyTest", tags=["notify"], response_model=list[NotifyResult])
    async def post_notify_test() -> list[NotifyResult]:
        raise not_built("notifications")

    @api.get("/api/v1/requests/{id}", operation_id="getRequestsId", tags=["requests"], response_model=RequestView)
    async def get_requests_id(id: str) -> RequestView:
        raise not_built("request records")

    @api.get("/api/v1/requests/{id}/body", operation_id="getRequestsIdBody", tags=["requests"], response_model=StoreRequestBody)
    async def get_requests_id_body(id: str) -> StoreRequestBody:
        raise not_built("request records")

    @api.post("/api/v1/requests/{id}/replay", operation_id="postRequestsIdReplay", tags=["requests"], response_model=ReplayView)
    async def post_requests_id_replay(id: str, body: ReplayRequest) -> ReplayView:
        raise not_built("request records")

    @api.get("/api/v1/settings", operation_id="getSettings", tags=["settings"], response_model=SettingsView)
    async def get_settings(version: str | None = None) -> SettingsView:
        raise not_built("settings")

    @api.put("/api/v1/settings", operation_id="putSettings", tags=["settings"], response_model=SettingsView)
    async def put_settings(body: SettingsRequest) -> SettingsView:
        raise not_built("settings")

    @api.get("/api/v1/settings/history", operation_id="getSettingsHistory", tags=["settings"], response_model=list[SettingsView])
    async def get_settings_history(limit: str | None = None) -> list[SettingsView]:
        raise not_built("settings")

    @api.post("/api/v1/settings/rollback", operation_id="postSettingsRollback", tags=["settings"], response_model=SettingsView)
    async def post_settings_rollback(body: SettingsRollbackRequest) -> SettingsView:
        raise not_built("settings")

    @api.get("/api/v1/usage", operation_id="getUsage", tags=["usage"], response_model=list[ScopeUsageView])
    async def get_usage(by: str | None = None, since: str | None = None) -> list[ScopeUsageView]:
        raise not_built("usage")

    @api.get(
        "/api/v1/usage/export",
        operation_id="getUsageExport",
        tags=["usage"],
        response_model=list[StoreExportRow],
        responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
    )
    async def get_usage_export(
        from_: str | None = Query(None, alias="from"),
        to: str | None = None,
        period: str | None = None,
        by: str | None = None,
        format: str | None = None,
    ) -> list[StoreExportRow]:
        raise not_built("usage")

    return api
