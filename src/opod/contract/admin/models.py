"""Wire types of the management API's model catalog: models, presets, serving jobs, updates, canaries, evaluations."""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from opod.contract.admin.base import ApiModel, ApiRequest, Int64, Timestamp
from opod.contract.admin.catalog import CatalogAdapter, CatalogCanary, CatalogEvalGate, CatalogLicense
from opod.contract.admin.common import BenchSLO


class AdaptersRequest(ApiRequest):
    adapters: list[CatalogAdapter] | None = None


class BenchCapacity(ApiRequest):
    model_config = ConfigDict(title="bench.Capacity")
    model: str | None = None
    profile: str | None = None
    max_concurrency_at_slo: int | None = None
    throughput_tok_per_sec: float | None = None
    ttft_p99: Int64 | None = None
    tpot_p99: Int64 | None = None
    suggested_target_waiting: int | None = None
    suggested_kv_ceiling: float | None = None
    slo: BenchSLO | None = None
    target: str | None = None
    measured_at: Timestamp | None = None


class CanaryPercentRequest(ApiRequest):
    percent: int | None = None


class CanarySide(ApiModel):
    model_config = ConfigDict(title="canary.Side")
    requests: Int64 | None = None
    errors: Int64 | None = None
    ttft_ms: float | None = None
    ttft_count: Int64 | None = None
    latency_ms: float | None = None
    latency_count: Int64 | None = None


class CanaryStat(ApiModel):
    model_config = ConfigDict(title="canary.Stat")
    canary: str | None = None
    since: datetime | None = None
    stable: CanarySide | None = None
    candidate: CanarySide | None = None


class CheckRequest(ApiRequest):
    model: str | None = None


class ClassRequest(ApiRequest):
    class_: str | None = Field(None, alias="class")


class ClassView(ApiModel):
    model: str | None = None
    class_: str | None = Field(None, alias="class")


class EvalGateRequest(ApiRequest):
    suite: str | None = None
    min_score: float | None = None
    judge: str | None = None


class EvalGateView(ApiModel):
    model: str | None = None
    eval: CatalogEvalGate | None = None


class StoreEvalCase(ApiModel):
    model_config = ConfigDict(title="store.EvalCase")
    id: str | None = None
    kind: str | None = None
    weight: float | None = None
    score: float | None = None
    passed: bool | None = None
    answer: str | None = None
    detail: str | None = None
    error: str | None = None
    took_ms: Int64 | None = None


class EvalLive(ApiModel):
    model_config = ConfigDict(title="eval.Live")
    id: str | None = None
    model: str | None = None
    target: str | None = None
    repo: str | None = None
    revision: str | None = None
    suite: str | None = None
    suite_hash: str | None = None
    at: datetime | None = None
    took_ms: Int64 | None = None
    score: float | None = None
    threshold: float | None = None
    passed: bool | None = None
    cases: int | None = None
    below: int | None = None
    errors: int | None = None
    judge: str | None = None
    by: str | None = None
    job: str | None = None
    error: str | None = None
    results: list[StoreEvalCase] | None = None
    state: str | None = None
    done: int | None = None


class EvalRequest(ApiRequest):
    model_config = ConfigDict(title="eval.Request")
    suite: str | None = None
    content: str | None = None
    file: str | None = None
    concurrency: int | None = None
    judge: str | None = None
    min_score: float | None = None


class EvalSuiteInfo(ApiModel):
    model_config = ConfigDict(title="eval.SuiteInfo")
    name: str | None = None
    from_: str | None = Field(None, alias="from")
    description: str | None = None
    cases: int | None = None
    threshold: float | None = None
    judge: bool | None = None
    hash: str | None = None
    error: str | None = None


class FallbacksRequest(ApiRequest):
    fallbacks: list[str] | None = None


class FallbacksView(ApiModel):
    model: str | None = None
    fallbacks: list[str] | None = None


class HeadroomView(ApiModel):
    model: str | None = None
    current: int | None = None
    more: int | None = None
    nodes: list[list[str]] | None = None
    limited: bool | None = None
    blocked: list[str] | None = None
    tok_per_sec: float | None = None
    by_preempting: int | None = None
    preempts: list[str] | None = None


class ModelAdded(ApiModel):
    added: str | None = None


class OriginView(ApiModel):
    repo: str | None = None
    revision: str | None = None
    previous: str | None = None


class ModelserveUpdateInfo(ApiModel):
    model_config = ConfigDict(title="modelserve.UpdateInfo")
    model: str | None = None
    repo: str | None = None
    current: str | None = None
    latest: str | None = None
    changed: list[str] | None = None
    missing: list[str] | None = None
    bytes: Int64 | None = None
    available: bool | None = None
    previous: str | None = None
    checked_at: datetime | None = None
    error: str | None = None


class ModelView(ApiModel):
    name: str | None = None
    canary: CatalogCanary | None = None
    canary_of: str | None = None
    eval: CatalogEvalGate | None = None
    description: str | None = None
    aliases: list[str] | None = None
    source: str | None = None
    role: str | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    ready_replicas: int | None = None
    total_replicas: int | None = None
    desired_replicas: int | None = None
    failures: int | None = None
    parked: bool | None = None
    reason: str | None = None
    unplaceable: bool | None = None
    fallbacks: list[str] | None = None
    profiles: list[str] | None = None
    memory_gb: int | None = None
    cpu_cores: int | None = None
    measured_memory_gb: float | None = None
    warnings: list[str] | None = None
    class_: str | None = Field(None, alias="class")
    owner: str | None = None
    external: str | None = None
    adapters: list[CatalogAdapter] | None = None
    preempted: int | None = None
    held_for: str | None = None
    origin: OriginView | None = None
    update: ModelserveUpdateInfo | None = None


class ModelplanOption(ApiModel):
    model_config = ConfigDict(title="modelplan.Option")
    artifact: str | None = None
    format: str | None = None
    engine: str | None = None
    cpu: bool | None = None
    gpu_class: str | None = None
    fabric: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    need_gb: float | None = None
    have_gb: float | None = None
    hosts: int | None = None
    free_now: bool | None = None
    bits_per_weight: float | None = None


class ModelserveCanaryView(ApiModel):
    model_config = ConfigDict(title="modelserve.CanaryView")
    model: str | None = None
    canary: CatalogCanary | None = None
    serving: CanaryStat | None = None


class ModelserveChange(ApiRequest):
    model_config = ConfigDict(title="modelserve.Change")
    eval: EvalRequest | None = None
    skip_eval: bool | None = None


class ModelserveRequest(ApiRequest):
    model_config = ConfigDict(title="modelserve.Request")
    repo: str | None = None
    quant: str | None = None
    file: str | None = None
    projector: str | None = None
    format: str | None = None
    cpu: bool | None = None
    gpu_class: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    tp: int | None = None
    fallbacks: bool | None = None
    name: str | None = None
    aliases: list[str] | None = None
    description: str | None = None
    replicas: int | None = None
    guard_format: str | None = None
    class_: str | None = Field(None, alias="class")
    ctx_pool: int | None = None
    context_length: int | None = None
    tools: bool | None = None
    embeddings: bool | None = None
    cpu_cores: int | None = None


class ModelserveStep(ApiModel):
    model_config = ConfigDict(title="modelserve.Step")
    name: str | None = None
    state: str | None = None
    detail: str | None = None
    at: datetime | None = None


class StoreEvalRun(ApiModel):
    model_config = ConfigDict(title="store.EvalRun")
    id: str | None = None
    model: str | None = None
    target: str | None = None
    repo: str | None = None
    revision: str | None = None
    suite: str | None = None
    suite_hash: str | None = None
    at: datetime | None = None
    took_ms: Int64 | None = None
    score: float | None = None
    threshold: float | None = None
    passed: bool | None = None
    cases: int | None = None
    below: int | None = None
    errors: int | None = None
    judge: str | None = None
    by: str | None = None
    job: str | None = None
    error: str | None = None
    results: list[StoreEvalCase] | None = None


class ModelserveJob(ApiModel):
    model_config = ConfigDict(title="modelserve.Job")
    id: str | None = None
    kind: str | None = None
    request: ModelserveRequest | None = None
    state: str | None = None
    error: str | None = None
    model: str | None = None
    steps: list[ModelserveStep] | None = None
    started: datetime | None = None
    reply: str | None = None
    tokens_per_second: float | None = None
    eval: StoreEvalRun | None = None


class ModelservePlannedArtifact(ApiModel):
    model_config = ConfigDict(title="modelserve.PlannedArtifact")
    name: str | None = None
    format: str | None = None
    bytes: Int64 | None = None
    shards: int | None = None
    quant: str | None = None
    best: ModelplanOption | None = None


class ModelservePlan(ApiModel):
    model_config = ConfigDict(title="modelserve.Plan")
    repo: str | None = None
    revision: str | None = None
    format: str | None = None
    architecture: str | None = None
    license: str | None = None
    params: Int64 | None = None
    context: int | None = None
    gated: bool | None = None
    servable: bool | None = None
    reason: str | None = None
    note: str | None = None
    projectors: list[str] | None = None
    artifacts: list[ModelservePlannedArtifact] | None = None
    options: list[ModelplanOption] | None = None


class OriginRequest(ApiRequest):
    repo: str | None = None


class OwnerRequest(ApiRequest):
    owner: str | None = None


class OwnerView(ApiModel):
    model: str | None = None
    owner: str | None = None


class PresetView(ApiModel):
    name: str | None = None
    makes: str | None = None
    description: str | None = None
    card: str | None = None
    licence: CatalogLicense | None = None
    fits: bool | None = None
    fits_classes: list[str] | None = None
    in_catalog: bool | None = None
    added_by: str | None = None
    added_at: datetime | None = None
    declined: bool | None = None
    blocked: str | None = None


class PresetsAutoRequest(ApiRequest):
    on: bool | None = None


class PresetsView(ApiModel):
    auto: bool | None = None
    comfyui: str | None = None
    presets: list[PresetView] | None = None


class ResourcesRequest(ApiRequest):
    profile: str | None = None
    memory_gb: int | None = None
    cpu_cores: int | None = None


class Result(ApiModel):
    result: str | None = None


class RetryView(ApiModel):
    was_parked: bool | None = None


class ScaleRequest(ApiRequest):
    min: int | None = None
    max: int | None = None
    idle_timeout: Int64 | None = None


class ScaleResponse(ApiModel):
    model: str | None = None
    min: int | None = None
    max: int | None = None
    idle_timeout: Int64 | None = None
    on_demand: bool | None = None


class TargetView(ApiModel):
    model: str | None = None
    tok_per_sec: float | None = None
    per_replica_tok_per_sec: float | None = None
    profile: str | None = None
    needed: int | None = None
    current: int | None = None
    more: int | None = None
    room: int | None = None
    fits: bool | None = None
    blocked: list[str] | None = None
    preempts: list[str] | None = None
