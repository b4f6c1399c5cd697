"""Wire types of the management API's fleet: the summary, nodes, replicas, capacity, restarts, weights on disk."""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from opod.contract.admin.base import ApiModel, ApiRequest, Int64
from opod.contract.admin.common import BenchSLO, JudgeView


class AgentRestartView(ApiModel):
    nodes: list[str] | None = None


class CapacityView(ApiModel):
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
    measured_at: datetime | None = None
    measured_by: str | None = None


class ClassGPUs(ApiModel):
    class_: str | None = Field(None, alias="class")
    total: int | None = None
    free: int | None = None
    unhealthy: int | None = None
    mig: bool | None = None


class ClassUse(ApiModel):
    class_: str | None = Field(None, alias="class")
    total: int | None = None
    used: int | None = None
    unhealthy: int | None = None


class CollectRequest(ApiRequest):
    node: str | None = None


class CollectResult(ApiModel):
    node: str | None = None
    files: int | None = None
    bytes: Int64 | None = None
    error: str | None = None


class ComputeView(ApiModel):
    backend: str | None = None
    devices: list[str] | None = None
    layers_offloaded: int | None = None
    layers_total: int | None = None


class ControlPlane(ApiModel):
    name: str | None = None
    address: str | None = None
    state: str | None = None
    this: bool | None = None


class ControlPlanes(ApiModel):
    members: list[ControlPlane] | None = None
    floating: str | None = None
    floating_up: bool | None = None


class RejectionView(ApiModel):
    profile: str | None = None
    pool: str | None = None
    node: str | None = None
    reason: str | None = None


class ExplainView(ApiModel):
    model: str | None = None
    placed: bool | None = None
    rejections: list[RejectionView] | None = None


class FabricUse(ApiModel):
    fabric: str | None = None
    nodes: int | None = None
    nodes_with_weights: int | None = None
    models_present: int | None = None
    largest_free_block: int | None = None


class FacilityLocation(ApiModel):
    model_config = ConfigDict(title="facility.Location")
    site: str | None = None
    room: str | None = None
    row: str | None = None
    rack: str | None = None
    pdus: list[str] | None = None


class FetchView(ApiModel):
    source: str | None = None
    bytes_done: Int64 | None = None
    bytes_total: Int64 | None = None
    percent: int | None = None


class GPUView(ApiModel):
    index: int | None = None
    name: str | None = None
    label: str | None = None
    class_: str | None = Field(None, alias="class")
    card: int | None = None
    mig_profile: str | None = None
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    compute_capability: str | None = None
    numa: int | None = None
    nvlink_peers: list[int] | None = None
    nearest_nic: str | None = None
    nic_path: str | None = None
    fabric_state: str | None = None
    domain: str | None = None
    bandwidth: str | None = None


class IBPortView(ApiModel):
    hca: str | None = None
    port: int | None = None
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: int | None = None
    link_layer: str | None = None
    active: bool | None = None
    fabric: str | None = None
    physical: str | None = None
    sm_error: str | None = None
    errors: dict[str, Int64] | None = None
    tx_bytes: Int64 | None = None
    rx_bytes: Int64 | None = None


class IdleReplica(ApiModel):
    id: str | None = None
    model: str | None = None
    idle_seconds: Int64 | None = None
    gpus: int | None = None


class InventoryEngineInstall(ApiModel):
    model_config = ConfigDict(title="inventory.EngineInstall")
    engine: str | None = None
    version: str | None = None
    variant: str | None = None
    state: str | None = None
    detail: str | None = None


class InventoryGPUWear(ApiModel):
    model_config = ConfigDict(title="inventory.GPUWear")
    pcie_replays: Int64 | None = None
    retired_pages_sbe: Int64 | None = None
    retired_pages_dbe: Int64 | None = None
    retire_pending: bool | None = None
    remapped_rows_correctable: Int64 | None = None
    remapped_rows_uncorrectable: Int64 | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    nvlink_crc_errors: Int64 | None = None
    nvlink_replay_errors: Int64 | None = None
    nvlink_recovery_errors: Int64 | None = None
    xid_errors: Int64 | None = None
    last_xid: int | None = None
    last_xid_text: str | None = None
    last_xid_at: datetime | None = None


class InventoryGPUSensor(ApiModel):
    model_config = ConfigDict(title="inventory.GPUSensor")
    index: int | None = None
    temp_c: float | None = None
    memory_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: list[str] | None = None
    util_percent: float | None = None
    mem_util_percent: float | None = None
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    sm_clock_mhz: float | None = None
    ecc_uncorrected: float | None = None
    wear: InventoryGPUWear | None = None


class LoadView(ApiModel):
    cpu_percent: float | None = None
    cpus: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    memory_used_bytes: Int64 | None = None
    memory_total_bytes: Int64 | None = None
    memory_percent: float | None = None
    age_seconds: Int64 | None = None
    cpu_temp_c: float | None = None
    cpu_power_w: float | None = None
    inlet_temp_c: float | None = None
    gpu_sensors: list[InventoryGPUSensor] | None = None


class LogsView(ApiModel):
    node: str | None = None
    source: str | None = None
    lines: list[str] | None = None
    sources: list[str] | None = None
    error: str | None = None


class ModelTotals(ApiModel):
    total: int | None = None
    satisfied: int | None = None
    short: int | None = None


class NodeEngineRequest(ApiRequest):
    engine: str | None = None
    build: str | None = None


class NodeLabelsRequest(ApiRequest):
    set: dict[str, str] | None = None
    remove: list[str] | None = None


class NodeLabelsView(ApiModel):
    id: str | None = None
    operator_labels: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    location: FacilityLocation | None = None


class NodeRemoved(ApiModel):
    id: str | None = None
    removed: str | None = None


class NodeStateRequest(ApiRequest):
    state: str | None = None


class NodeStateView(ApiModel):
    id: str | None = None
    state: str | None = None


class NodeTotals(ApiModel):
    total: int | None = None
    ready: int | None = None
    cordoned: int | None = None
    draining: int | None = None
    unreachable: int | None = None


class NodeView(ApiModel):
    id: str | None = None
    hostname: str | None = None
    mgmt_addr: str | None = None
    state: str | None = None
    labels: dict[str, str] | None = None
    gpu_total: int | None = None
    gpu_free: int | None = None
    memory_gb: int | None = None
    cpu_count: int | None = None
    engines: list[str] | None = None
    engine_versions: dict[str, str] | None = None
    multi_node: str | None = None
    compute_capabilities: list[str] | None = None
    provision: list[InventoryEngineInstall] | None = None
    engine_builds: dict[str, str] | None = None
    os: str | None = None
    warnings: list[str] | None = None
    models_on_disk: list[str] | None = None
    disk_free_gb: int | None = None
    disk_total_gb: int | None = None
    gpu_classes: list[str] | None = None
    gpus_by_class: list[ClassGPUs] | None = None
    fabrics: list[str] | None = None
    unhealthy_gpus: list[str] | None = None
    location: FacilityLocation | None = None
    held: str | None = None
    held_domain: str | None = None
    operator_labels: dict[str, str] | None = None
    last_seen_ago: str | None = None
    agent_version: str | None = None
    features: list[str] | None = None
    replicas: int | None = None
    load: LoadView | None = None
    ib_ports: list[IBPortView] | None = None
    gpus: list[GPUView] | None = None
    nvlink_domain: str | None = None
    imex: str | None = None
    imex_channels: int | None = None


class OrphanView(ApiModel):
    node: str | None = None
    paths: list[str] | None = None
    bytes: Int64 | None = None


class ParkedModel(ApiModel):
    model: str | None = None
    failures: int | None = None
    reason: str | None = None


class ReplicaTotal(ApiModel):
    ready: int | None = None
    starting: int | None = None
    draining: int | None = None
    failed: int | None = None


class ShardView(ApiModel):
    id: str | None = None
    node: str | None = None
    rank: int | None = None
    gpus: list[int] | None = None
    state: str | None = None
    error: str | None = None
    fetch: FetchView | None = None
    cpu_cores: float | None = None
    memory_bytes: Int64 | None = None
    compute: ComputeView | None = None


class ReplicaView(ApiModel):
    id: str | None = None
    engine_key: str | None = None
    restart: str | None = None
    model: str | None = None
    profile: str | None = None
    stale: bool | None = None
    state: str | None = None
    pool: str | None = None
    fabric: str | None = None
    endpoint: str | None = None
    age_seconds: Int64 | None = None
    idle_seconds: Int64 | None = None
    error: str | None = None
    shards: list[ShardView] | None = None


class RestartRequest(ApiRequest):
    replicas: list[str] | None = None
    models: list[str] | None = None
    all: bool | None = None
    in_place: bool | None = None
    max_surge: int | None = None
    max_unavailable: int | None = None


class RestartResult(ApiModel):
    queued: list[str] | None = None


class StoreMember(ApiModel):
    name: str | None = None
    host: str | None = None
    role: str | None = None
    state: str | None = None
    lag: Int64 | None = None


class Summary(ApiModel):
    version: str | None = None
    nodes: NodeTotals | None = None
    gpus: list[ClassUse] | None = None
    fabrics: list[FabricUse] | None = None
    replicas: ReplicaTotal | None = None
    models: ModelTotals | None = None
    unplaceable: list[str] | None = None
    parked: list[ParkedModel] | None = None
    idle_replicas: list[IdleReplica] | None = None
    store: list[StoreMember] | None = None
    store_error: str | None = None
    control_planes: ControlPlanes | None = None
    judges: list[JudgeView] | None = None
    stopped: bool | None = None
    guard_off: bool | None = None


class UpgradeRequest(ApiRequest):
    version: str | None = None


class UpgradeView(ApiModel):
    node: str | None = None
    version: str | None = None
