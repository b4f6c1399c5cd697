"""Wire types of the management API's services: guardrails, knowledge bases, training, federation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ConfigDict

from opod.contract.admin.base import ApiModel, ApiRequest, Int64


class FederationAddRequest(ApiRequest):
    model_config = ConfigDict(title="federation.AddRequest")
    name: str | None = None
    url: str | None = None
    key_file: str | None = None
    send_tags: bool | None = None


class FederationModelStatus(ApiModel):
    model_config = ConfigDict(title="federation.ModelStatus")
    name: str | None = None
    upstream: str | None = None
    withdrawn: bool | None = None


class FederationStatus(ApiModel):
    model_config = ConfigDict(title="federation.Status")
    name: str | None = None
    url: str | None = None
    key_file: str | None = None
    send_tags: bool | None = None
    cluster: str | None = None
    up: bool | None = None
    checked: datetime | None = None
    latency_ns: Int64 | None = None
    error: str | None = None
    latency_ms: float | None = None
    synced_at: datetime | None = None
    models: list[FederationModelStatus] | None = None
    created_at: datetime | None = None
    created_by: str | None = None


class FederationView(ApiModel):
    cluster: str | None = None
    peers: list[FederationStatus] | None = None


class GuardAttachment(ApiModel):
    model_config = ConfigDict(title="guard.Attachment")
    Scope: str | None = None
    ScopeID: str | None = None
    Policy: str | None = None


class GuardAttachmentRequest(ApiRequest):
    target: str | None = None
    policy: str | None = None


class GuardAttachmentView(ApiModel):
    Scope: str | None = None
    ScopeID: str | None = None
    Policy: str | None = None
    name: str | None = None


class GuardCountView(ApiModel):
    project: str | None = None
    action: str | None = None
    policy: str | None = None
    category: str | None = None
    count: Int64 | None = None


class GuardEventView(ApiModel):
    at: datetime | None = None
    request_id: str | None = None
    project: str | None = None
    model: str | None = None
    status: int | None = None
    action: str | None = None
    policy: str | None = None
    category: str | None = None
    rule: str | None = None
    guard_ms: Int64 | None = None


class GuardEventsView(ApiModel):
    since: datetime | None = None
    counts: list[GuardCountView] | None = None
    events: list[GuardEventView] | None = None


class GuardPolicyView(ApiModel):
    name: str | None = None
    mode: str | None = None
    fail: str | None = None
    no_store: bool | None = None
    judge: str | None = None
    checks: list[str] | None = None


class GuardView(ApiModel):
    enabled: bool | None = None
    policies: list[str] | None = None
    default: list[str] | None = None
    attachments: list[GuardAttachmentView] | None = None
    details: list[GuardPolicyView] | None = None


class JudgeAskRequest(ApiRequest):
    model: str | None = None
    text: str | None = None
    answer: str | None = None


class JudgeAskView(ApiModel):
    model: str | None = None
    verdict: str | None = None
    categories: list[str] | None = None
    raw: str | None = None
    took_ms: Int64 | None = None


class KBGrantView(ApiModel):
    target: str | None = None
    name: str | None = None
    perm: str | None = None
    at: datetime | None = None
    by: str | None = None


class KBCollectionView(ApiModel):
    id: str | None = None
    name: str | None = None
    org: str | None = None
    org_name: str | None = None
    owner: str | None = None
    owner_name: str | None = None
    embed_model: str | None = None
    dims: int | None = None
    documents: int | None = None
    chunks: int | None = None
    grants: list[KBGrantView] | None = None
    created_at: datetime | None = None
    created_by: str | None = None


class KBCreateRequest(ApiRequest):
    owner: str | None = None
    org: str | None = None
    name: str | None = None
    model: str | None = None
    dims: int | None = None


class KBDatasetLine(ApiModel):
    q: str | None = None
    a: str | None = None
    doc: str | None = None
    ord: int | None = None
    collection: str | None = None
    error: str | None = None


class KBDatasetRequest(ApiRequest):
    model: str | None = None
    per_chunk: int | None = None
    max_chunks: int | None = None


class KBDefaultRequest(ApiRequest):
    target: str | None = None
    collections: list[str] | None = None


class KBDefaultView(ApiModel):
    target: str | None = None
    name: str | None = None
    collections: list[str] | None = None
    at: datetime | None = None
    by: str | None = None


class KBDocumentView(ApiModel):
    name: str | None = None
    digest: str | None = None
    bytes: Int64 | None = None
    chunks: int | None = None
    added_at: datetime | None = None
    added_by: str | None = None


class KBGrantRequest(ApiRequest):
    collection: str | None = None
    target: str | None = None
    perm: str | None = None


class KBHitView(ApiModel):
    document: str | None = None
    ord: int | None = None
    score: float | None = None
    text: str | None = None


class KBSearchRequest(ApiRequest):
    collection: str | None = None
    query: str | None = None
    k: int | None = None


class KBView(ApiModel):
    available: bool | None = None
    reason: str | None = None
    collections: list[KBCollectionView] | None = None
    defaults: list[KBDefaultView] | None = None


class TrainJobView(ApiModel):
    id: str | None = None
    name: str | None = None
    model: str | None = None
    base_repo: str | None = None
    base_revision: str | None = None
    node: str | None = None
    owner: str | None = None
    gpu_memory_mib: int | None = None
    params: str | None = None
    gguf: bool | None = None
    pairs: int | None = None
    state: str | None = None
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    message: str | None = None
    peak_mib: int | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    created_by: str | None = None
    artifacts: list[str] | None = None


class TrainPublishView(ApiModel):
    adapter: str | None = None
    model: str | None = None
    source: str | None = None
    owner: str | None = None
    note: str | None = None


class TrainRequest(ApiRequest):
    name: str | None = None
    model: str | None = None
    base_repo: str | None = None
    base_revision: str | None = None
    node: str | None = None
    gpu_memory_mib: int | None = None
    owner: str | None = None
    public: bool | None = None
    data: str | None = None
    params: dict[str, Any] | None = None
    gguf: bool | None = None
