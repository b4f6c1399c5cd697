"""Wire types of the management API's catalog entries: a model, its placement profiles, scaling, adapters."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from opod.contract.admin.base import ApiRequest, Int64


class CatalogAdapter(ApiRequest):
    model_config = ConfigDict(title="catalog.Adapter")
    name: str | None = None
    source: str | None = None
    scale: float | None = None
    owner: str | None = None


class CatalogCanary(ApiRequest):
    model_config = ConfigDict(title="catalog.Canary")
    model: str | None = None
    percent: int | None = None
    min_requests: int | None = None
    max_error_increase: float | None = None
    max_ttft_ratio: float | None = None


class CatalogCapabilities(ApiRequest):
    model_config = ConfigDict(title="catalog.Capabilities")
    tools: bool | None = None
    vision: bool | None = None
    embeddings: bool | None = None
    images: bool | None = None
    meshes: bool | None = None


class CatalogInput(ApiRequest):
    model_config = ConfigDict(title="catalog.Input")
    name: str | None = None
    type: str | None = None
    required: bool | None = None
    default: Any | None = None
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None
    max_mb: int | None = None
    doc: str | None = None


class CatalogCustomNode(ApiRequest):
    model_config = ConfigDict(title="catalog.CustomNode")
    repo: str | None = None
    commit: str | None = None
    requirements: list[str] | None = None
    build: list[str] | None = None


class CatalogComfyUI(ApiRequest):
    model_config = ConfigDict(title="catalog.ComfyUI")
    workflow: str | None = None
    checkpoint: str | None = None
    output: str | None = None
    inputs: list[CatalogInput] | None = None
    nodes: list[CatalogCustomNode] | None = None
    huggingface_repo: str | None = None
    environment: str | None = None


class CatalogEvalGate(ApiRequest):
    model_config = ConfigDict(title="catalog.EvalGate")
    suite: str | None = None
    min_score: float | None = None
    judge: str | None = None


class CatalogExternalKey(ApiRequest):
    model_config = ConfigDict(title="catalog.ExternalKey")
    file: str | None = None
    weight: float | None = None


class CatalogExternal(ApiRequest):
    model_config = ConfigDict(title="catalog.External")
    url: str | None = None
    model: str | None = None
    api_key_file: str | None = None
    api_key_files: list[CatalogExternalKey] | None = None
    peer: str | None = None
    api: str | None = None
    workflow: str | None = None
    output: str | None = None


class CatalogGPUNeed(ApiRequest):
    model_config = ConfigDict(title="catalog.GPUNeed")
    min_compute_capability: float | None = None
    min_memory_gb: int | None = None


class CatalogGuardModel(ApiRequest):
    model_config = ConfigDict(title="catalog.GuardModel")
    format: str | None = None
    categories: list[str] | None = None


class CatalogLicense(ApiRequest):
    model_config = ConfigDict(title="catalog.License")
    id: str | None = None
    name: str | None = None
    url: str | None = None
    notice: str | None = None
    commercial: bool | None = None
    excluded_regions: list[str] | None = None
    revenue_cap_usd: Int64 | None = None
    attribution: str | None = None


class CatalogProfileComfyUI(ApiRequest):
    model_config = ConfigDict(title="catalog.ProfileComfyUI")
    workflow: str | None = None
    checkpoint: str | None = None
    nodes: list[CatalogCustomNode] | None = None


class CatalogProfile(ApiRequest):
    model_config = ConfigDict(title="catalog.Profile")
    name: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    gpu_class: str | None = None
    source: str | None = None
    tp: int | None = None
    pp: int | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    min_memory_gb: int | None = None
    cpu_cores: int | None = None
    min_disk_gb: int | None = None
    node_selector: dict[str, str] | None = None
    power_watts: float | None = None
    keep_within: str | None = None
    weight: float | None = None
    priority: int | None = None
    startup_timeout: Int64 | None = None
    kv_events: bool | None = None
    gpu: CatalogGPUNeed | None = None
    comfyui: CatalogProfileComfyUI | None = None


class CatalogScaleWindow(ApiRequest):
    model_config = ConfigDict(title="catalog.ScaleWindow")
    days: list[str] | None = None
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    min: int | None = None
    max: int | None = None


class CatalogScaling(ApiRequest):
    model_config = ConfigDict(title="catalog.Scaling")
    min: int | None = None
    max: int | None = None
    idle_timeout: Int64 | None = None
    schedule: list[CatalogScaleWindow] | None = None
    prewarm: Int64 | None = None


class CatalogSLO(ApiRequest):
    model_config = ConfigDict(title="catalog.SLO")
    TTFTp99: Int64 | None = None
    TPOTp99: Int64 | None = None


class CatalogOriginFile(ApiRequest):
    model_config = ConfigDict(title="catalog.OriginFile")
    path: str | None = None
    sha256: str | None = None
    bytes: Int64 | None = None


class CatalogPreviousOrigin(ApiRequest):
    model_config = ConfigDict(title="catalog.PreviousOrigin")
    source: str | None = None
    revision: str | None = None
    files: list[CatalogOriginFile] | None = None


class CatalogOrigin(ApiRequest):
    model_config = ConfigDict(title="catalog.Origin")
    repo: str | None = None
    revision: str | None = None
    files: list[CatalogOriginFile] | None = None
    previous: CatalogPreviousOrigin | None = None


class CatalogSharedMember(ApiRequest):
    model_config = ConfigDict(title="catalog.SharedMember")
    name: str | None = None
    aliases: list[str] | None = None
    source: str | None = None
    hf_repo: str | None = None
    workflow: str | None = None
    checkpoint: str | None = None


class CatalogSharedComfy(ApiRequest):
    model_config = ConfigDict(title="catalog.SharedComfy")
    environment: str | None = None
    members: list[CatalogSharedMember] | None = None


class CatalogModel(ApiRequest):
    model_config = ConfigDict(title="catalog.Model")
    name: str | None = None
    aliases: list[str] | None = None
    description: str | None = None
    source: str | None = None
    profiles: list[CatalogProfile] | None = None
    scaling: CatalogScaling | None = None
    class_: str | None = Field(None, alias="class")
    owner: str | None = None
    external: CatalogExternal | None = None
    comfyui: CatalogComfyUI | None = None
    license: CatalogLicense | None = None
    adapters: list[CatalogAdapter] | None = None
    max_loaded_adapters: int | None = None
    fallbacks: list[str] | None = None
    canary: CatalogCanary | None = None
    eval: CatalogEvalGate | None = None
    routing_profile: str | None = None
    slo: CatalogSLO | None = None
    context_length: int | None = None
    max_output: int | None = None
    capabilities: CatalogCapabilities | None = None
    query_prefix: str | None = None
    role: str | None = None
    guard: CatalogGuardModel | None = None
    origin: CatalogOrigin | None = None
    shared: CatalogSharedComfy | None = None
