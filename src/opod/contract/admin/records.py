"""Wire types of the management API's records: usage, requests, audit, settings, notifications, metrics, client jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ConfigDict

from opod.contract.admin.base import ApiModel, ApiRequest, Int64


class JobView(ApiModel):
    id: str | None = None
    owner: str | None = None
    key_id: str | None = None
    endpoint: str | None = None
    model: str | None = None
    status: str | None = None
    progress: Any | None = None
    output_file_id: str | None = None
    content_type: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    started_at: str | None = None
    finished_at: str | None = None


class MetricsQuery(ApiRequest):
    id: str | None = None
    expr: str | None = None
    by: str | None = None


class MetricsRequest(ApiRequest):
    window: Int64 | None = None
    step: Int64 | None = None
    queries: list[MetricsQuery] | None = None


class PromqPoint(ApiModel):
    model_config = ConfigDict(title="promq.Point")
    At: datetime | None = None
    Value: float | None = None


class PromqSeries(ApiModel):
    model_config = ConfigDict(title="promq.Series")
    Name: str | None = None
    Points: list[PromqPoint] | None = None


class MetricsResult(ApiModel):
    configured: bool | None = None
    series: dict[str, list[PromqSeries]] | None = None
    errors: dict[str, str] | None = None


class NotifyResult(ApiModel):
    model_config = ConfigDict(title="notify.Result")
    url: str | None = None
    error: str | None = None


class ReplayRequest(ApiRequest):
    model: str | None = None


class StoreRequestBody(ApiModel):
    model_config = ConfigDict(title="store.RequestBody")
    request_id: str | None = None
    project_id: str | None = None
    at: datetime | None = None
    expires_at: datetime | None = None
    path: str | None = None
    model: str | None = None
    served_model: str | None = None
    status: int | None = None
    request: str | None = None
    response: str | None = None
    truncated: bool | None = None


class ReplayView(ApiModel):
    original: StoreRequestBody | None = None
    model: str | None = None
    status: int | None = None
    body: Any | None = None
    took_ms: Int64 | None = None


class RequestView(ApiModel):
    request_id: str | None = None
    at: datetime | None = None
    key_id: str | None = None
    user_id: str | None = None
    project_id: str | None = None
    model: str | None = None
    served_model: str | None = None
    replica: str | None = None
    status: int | None = None
    latency_ms: Int64 | None = None
    queue_ms: Int64 | None = None
    ttft_ms: Int64 | None = None
    prompt_tokens: Int64 | None = None
    completion_tokens: Int64 | None = None
    images: Int64 | None = None
    meshes: Int64 | None = None
    cost_micros: Int64 | None = None
    guard_action: str | None = None
    guard_policy: str | None = None
    guard_category: str | None = None
    guard_rule: str | None = None
    guard_ms: Int64 | None = None
    end_user: str | None = None
    tags: dict[str, str] | None = None
    cache_hit: bool | None = None


class ScopeUsageView(ApiModel):
    scope: str | None = None
    id: str | None = None
    name: str | None = None
    keys: Int64 | None = None
    requests: Int64 | None = None
    prompt_tokens: Int64 | None = None
    completion_tokens: Int64 | None = None
    cost_micros: Int64 | None = None
    errors: Int64 | None = None
    last_at: datetime | None = None
    budget_micros: Int64 | None = None
    budget_period: str | None = None
    fraction: float | None = None


class SettingsRequest(ApiRequest):
    base: Int64 | None = None
    body: str | None = None
    note: str | None = None


class SettingsRollbackRequest(ApiRequest):
    version: Int64 | None = None
    note: str | None = None


class SettingsView(ApiModel):
    version: Int64 | None = None
    body: str | None = None
    note: str | None = None
    at: datetime | None = None
    by: str | None = None
    local_keys: list[str] | None = None


class StoreAuditEvent(ApiModel):
    model_config = ConfigDict(title="store.AuditEvent")
    id: Int64 | None = None
    at: datetime | None = None
    actor: str | None = None
    source: str | None = None
    action: str | None = None
    target: str | None = None
    detail: str | None = None
    status: int | None = None


class StoreExportRow(ApiModel):
    model_config = ConfigDict(title="store.ExportRow")
    Period: datetime | None = None
    Org: str | None = None
    Team: str | None = None
    Project: str | None = None
    User: str | None = None
    Key: str | None = None
    Model: str | None = None
    Requests: Int64 | None = None
    Errors: Int64 | None = None
    Limited: Int64 | None = None
    Prompt: Int64 | None = None
    Completion: Int64 | None = None
    CostMicros: Int64 | None = None
    Images: Int64 | None = None
    Meshes: Int64 | None = None
