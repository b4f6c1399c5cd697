"""Wire types of the management API's hardware views: fabrics, NVLink domains, the facility's power."""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from opod.contract.admin.base import ApiModel, ApiRequest, Int64


class HoldView(ApiModel):
    domain: str | None = None
    reason: str | None = None
    drain: bool | None = None
    by: str | None = None
    at: datetime | None = None
    nodes: list[str] | None = None


class DomainView(ApiModel):
    domain: str | None = None
    level: str | None = None
    name: str | None = None
    nodes: list[str] | None = None
    cap_watts: float | None = None
    limit_watts: float | None = None
    other_watts: float | None = None
    reserved_watts: float | None = None
    measured_watts: float | None = None
    used_watts: float | None = None
    held: HoldView | None = None


class FabricTestRequest(ApiRequest):
    a: str | None = None
    b: str | None = None
    fabric: str | None = None
    seconds: int | None = None


class RailView(ApiModel):
    a: str | None = None
    b: str | None = None
    rate_gbps: int | None = None
    gbps: float | None = None
    verdict: str | None = None
    detail: str | None = None


class FabricTestView(ApiModel):
    a: str | None = None
    b: str | None = None
    fabric: str | None = None
    ok: bool | None = None
    rails: list[RailView] | None = None
    notes: list[str] | None = None
    took: str | None = None


class FabricsChange(ApiModel):
    model_config = ConfigDict(title="fabrics.Change")
    at: datetime | None = None
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    ports: int | None = None


class FabricsMember(ApiModel):
    model_config = ConfigDict(title="fabrics.Member")
    node: str | None = None
    hcas: list[str] | None = None
    declared: str | None = None


class FabricsSM(ApiModel):
    model_config = ConfigDict(title="fabrics.SM")
    guid: str | None = None
    lid: int | None = None
    priority: int | None = None
    state: str | None = None


class FabricsPhysical(ApiModel):
    model_config = ConfigDict(title="fabrics.Physical")
    key: str | None = None
    kind: str | None = None
    label: str | None = None
    sm: FabricsSM | None = None
    sms: list[FabricsSM] | None = None
    standbys: int | None = None
    masters: dict[str, int] | None = None
    changes: list[FabricsChange] | None = None
    declared: list[str] | None = None
    members: list[FabricsMember] | None = None
    rate_gbps: int | None = None
    gid_prefix: str | None = None


class FabricsProblem(ApiModel):
    model_config = ConfigDict(title="fabrics.Problem")
    level: str | None = None
    fabric: str | None = None
    message: str | None = None


class FabricsReport(ApiModel):
    model_config = ConfigDict(title="fabrics.Report")
    physical: list[FabricsPhysical] | None = None
    problems: list[FabricsProblem] | None = None
    unverified: dict[str, list[str]] | None = None


class FacilityView(ApiModel):
    domains: list[DomainView] | None = None
    holds: list[HoldView] | None = None
    margin: float | None = None
    unlocated: list[str] | None = None


class HoldRequest(ApiRequest):
    domain: str | None = None
    reason: str | None = None
    drain: bool | None = None


class Live(ApiModel):
    node: str | None = None
    hca: str | None = None
    state: str | None = None
    phys_state: str | None = None
    gbps: int | None = None
    tx_bps: float | None = None
    rx_bps: float | None = None
    errors: dict[str, Int64] | None = None


class NvlinkGPU(ApiModel):
    model_config = ConfigDict(title="nvlink.GPU")
    index: int | None = None
    name: str | None = None
    state: str | None = None
    status: str | None = None
    bandwidth: str | None = None
    joined: bool | None = None


class NvlinkMember(ApiModel):
    model_config = ConfigDict(title="nvlink.Member")
    node: str | None = None
    gpus: list[NvlinkGPU] | None = None
    usable: bool | None = None
    imex: str | None = None
    imex_channels: int | None = None


class NvlinkDomain(ApiModel):
    model_config = ConfigDict(title="nvlink.Domain")
    key: str | None = None
    cluster_uuid: str | None = None
    clique_id: str | None = None
    members: list[NvlinkMember] | None = None
    gpus: int | None = None
    joined: int | None = None
    usable_nodes: int | None = None


class NvlinkProblem(ApiModel):
    model_config = ConfigDict(title="nvlink.Problem")
    level: str | None = None
    domain: str | None = None
    message: str | None = None


class NvlinkReport(ApiModel):
    model_config = ConfigDict(title="nvlink.Report")
    domains: list[NvlinkDomain] | None = None
    problems: list[NvlinkProblem] | None = None


class TopologyHostView(ApiModel):
    model_config = ConfigDict(title="topology.HostView")
    guid: str | None = None
    desc: str | None = None
    node: str | None = None
    hca: str | None = None
    rail: int | None = None
    leaf: str | None = None


class TopologyLinkView(ApiModel):
    model_config = ConfigDict(title="topology.LinkView")
    from_: str | None = Field(None, alias="from")
    from_port: int | None = None
    to: str | None = None
    to_port: int | None = None
    rate: str | None = None
    gbps: int | None = None
    host: bool | None = None
    degraded: bool | None = None


class TopologySwitchView(ApiModel):
    model_config = ConfigDict(title="topology.SwitchView")
    guid: str | None = None
    name: str | None = None
    tier: int | None = None
    ports: int | None = None
    used: int | None = None
    lid: int | None = None
    hosts: int | None = None


class TopologyRail(ApiModel):
    model_config = ConfigDict(title="topology.Rail")
    index: int | None = None
    leaves: list[str] | None = None


class TopologyMap(ApiModel):
    model_config = ConfigDict(title="topology.View")
    switches: list[TopologySwitchView] | None = None
    hosts: list[TopologyHostView] | None = None
    links: list[TopologyLinkView] | None = None
    tiers: int | None = None
    expected_host_gbps: int | None = None
    expected_switch_gbps: int | None = None
    degraded: int | None = None
    rails: list[TopologyRail] | None = None
    rail_aligned: bool | None = None
    notes: list[str] | None = None


class TopologyView(ApiModel):
    id: str | None = None
    key: str | None = None
    label: str | None = None
    declared: list[str] | None = None
    scanned_at: datetime | None = None
    scanned_by: str | None = None
    took_ms: Int64 | None = None
    error: str | None = None
    map: TopologyMap | None = None
    live: dict[str, Live] | None = None
    problems: list[FabricsProblem] | None = None
    sm: FabricsSM | None = None
    sms: list[FabricsSM] | None = None
