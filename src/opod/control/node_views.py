"""The node views of ``/api/v1/nodes`` and the summary's fabrics: what a node's worker reported, with the operator's side.

A node view is what its worker reported (``NodeState.inventory``: devices with MIG
instances as their own, labels, software) with the operator's side (cordon or drain,
operator labels, engine builds, the wanted release), all kept in the store. A device
is free when it is healthy and no replica holds it (the reconciler's replicas, when
it tracks any). ``state`` is ``unreachable`` or ``lost`` for a node that stopped
heartbeating, else the operator's state: ``ready``, ``cordoned`` or ``draining``.
Its ``fabrics`` are the fabrics it declares and ``multi_node`` whether it may take part
in a replica across nodes (``ready``, or ``down: ADAPTERS``; absent on no fabric); each
card shows its NVLink peers, and its multi-node NVLink domain (``domain``, ``fabric_state``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import TypeAdapter

from opod.contract import nodeapi
from opod.contract.admin.fleet import (
    ClassGPUs,
    FacilityLocation,
    GPUView,
    InventoryEngineInstall,
    InventoryGPUSensor,
    InventoryGPUWear,
    LoadView,
    NodeView,
)
from opod.control.context import ReplicaRecord
from opod.fleet.inventory import GPUDevice, location
from opod.fleet.liveness import node_state, reachability, takes_new_work
from opod.fleet.nodes_service import silent_for
from opod.fleet.state import NodeState

_IDLE_STATES = ("stopped", "failed", "parked")
"""Replica states that hold no device."""


def held_devices(replicas: Iterable[ReplicaRecord]) -> dict[str, set[int]]:
    """node id → device indices some replica holds there (the reconciler's replicas)."""
    out: dict[str, set[int]] = {}
    for replica in replicas:
        if replica.state in _IDLE_STATES:
            continue
        for node_id, indices in replica.gpus.items():
            out.setdefault(node_id, set()).update(indices)
    return out


def go_duration(seconds: float) -> str:
    """Whole seconds as Go writes a ``time.Duration``: ``45s``, ``3m4s``, ``2h0m5s``."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def state_word(node: NodeState, now: float, wall: float) -> str:
    return reachability(node, now, silent_for(node, wall)) or node_state(node)


def _replicas(node: NodeState) -> int:
    return len({*node.loaded_models, *node.model_engines})


def location_view(labels: dict[str, str]) -> FacilityLocation | None:
    found = location(labels)
    return FacilityLocation.model_construct(**found) if found else None  # type: ignore[arg-type]


NODE_VIEW = TypeAdapter(NodeView)
LOAD_VIEW = TypeAdapter(LoadView)


def _sensor_view(s: nodeapi.GPUSensor) -> InventoryGPUSensor:
    said: dict[str, Any] = {
        k: v
        for k, v in (
            ("pcie_replays", s.pcie_replays),
            ("retired_pages_sbe", s.retired_pages_sbe),
            ("retired_pages_dbe", s.retired_pages_dbe),
            ("retire_pending", s.retire_pending),
            ("remapped_rows_correctable", s.remapped_rows_correctable),
            ("remapped_rows_uncorrectable", s.remapped_rows_uncorrectable),
            ("remap_pending", s.remap_pending),
            ("remap_failure", s.remap_failure),
        )
        if v is not None
    }
    wear = InventoryGPUWear.model_construct(**said)
    return InventoryGPUSensor.model_construct(
        index=s.index,
        temp_c=s.temp_c,
        memory_temp_c=s.memory_temp_c,
        power_w=s.power_w,
        power_limit_w=s.power_limit_w,
        util_percent=s.util_percent,
        mem_util_percent=s.mem_util_percent,
        memory_used_mb=s.memory_used_mb,
        memory_total_mb=s.memory_total_mb,
        sm_clock_mhz=s.sm_clock_mhz,
        ecc_uncorrected=float(s.ecc_uncorrected) if s.ecc_uncorrected is not None else None,
        wear=wear if wear.model_fields_set else None,
    )


def load_view(node: NodeState, wall: float | None) -> LoadView:
    """The host's load as its latest heartbeat reported it (the real machine, declared inventory or not);
    before any report, the machine's size from its registration. ``wall`` None leaves ``age_seconds`` out."""
    hw, report = node.hardware, node.host_load
    if report is None:
        return LoadView.model_construct(cpus=hw.cpu_cores or None, memory_total_bytes=(hw.ram_gb << 30) or None)
    total = report.memory_total_bytes or (hw.ram_gb << 30)
    used = report.memory_used_bytes
    return LoadView.model_construct(
        cpu_percent=report.cpu_percent,
        cpus=report.cpus or hw.cpu_cores or None,
        load1=report.load1,
        load5=report.load5,
        load15=report.load15,
        memory_used_bytes=used or None,
        memory_total_bytes=total or None,
        memory_percent=round(100 * used / total, 1) if used and total else None,
        age_seconds=max(0, int(wall - node.host_load_at)) if wall is not None else None,
        cpu_temp_c=report.cpu_temp_c,
        gpu_sensors=[_sensor_view(s) for s in report.gpus] if report.gpus else None,
    )


def _provision(node: NodeState) -> list[InventoryEngineInstall] | None:
    return [
        InventoryEngineInstall.model_construct(
            engine=p.engine,
            version=p.version or None,
            variant=p.variant or None,
            state=p.state,
            detail=p.detail or None,
        )
        for p in node.inventory.provision
    ] or None


DeviceViews = dict[str, tuple[list[GPUDevice], list[GPUView], list[str]]]
"""node id → (its device list, their views, compute capabilities): a node's devices change only when a report
replaces the list, so their views are built once per report, not once per listing."""


def _device_views(node: NodeState, cache: DeviceViews) -> tuple[list[GPUView], list[str]]:
    devices = node.inventory.gpus
    cached = cache.get(node.id)
    if cached is not None and cached[0] is devices:
        return cached[1], cached[2]
    views = [
        GPUView.model_construct(
            index=d.index,
            name=d.name,
            label=d.label,
            class_=d.gpu_class,
            card=d.card,
            mig_profile=d.mig_profile or None,
            memory_total_mb=d.memory_mb,
            compute_capability=d.compute_capability or None,
            nvlink_peers=list(d.nvlink_peers) or None,
            domain=d.nvlink_domain or None,
            fabric_state=d.fabric_state or None,
        )
        for d in devices
    ]
    capabilities = sorted({d.compute_capability for d in devices if d.compute_capability})
    cache[node.id] = (devices, views, capabilities)
    return views, capabilities


def node_view(node: NodeState, held: set[int], now: float, wall: float, cache: DeviceViews | None = None) -> NodeView:
    inv = node.inventory
    devices = inv.gpus
    device_views, capabilities = _device_views(node, {} if cache is None else cache)
    counts: dict[str, list[int]] = {}
    """class → [total, free, unhealthy, mig], in plain values: one wire object per class at the end."""
    free = 0
    for d in devices:
        row = counts.get(d.gpu_class)
        if row is None:
            row = counts[d.gpu_class] = [0, 0, 0, d.mig]
        row[0] += 1
        if not d.healthy:
            row[2] += 1
        elif d.index not in held:
            row[1] += 1
            free += 1
    by_class = {
        c: ClassGPUs.model_construct(class_=c, total=t, free=f, unhealthy=u, mig=bool(m))
        for c, (t, f, u, m) in counts.items()
    }
    warnings = list(inv.warnings)
    live, why = takes_new_work(node, now)
    if not live and why not in ("drained", "cordoned") and not why.startswith("no heartbeat"):
        warnings.append(f"takes no requests: {why}")
    wanted = inv.operator.wanted_version
    if wanted and wanted != inv.agent_version and not any(wanted in w for w in inv.warnings):
        # The worker's own warning ("upgrading to", "upgrade to ... failed") says more once it has one.
        running = inv.agent_version or "an unknown release"
        warnings.append(
            f"release {wanted} is wanted; the agent runs {running} and has not started upgrading yet"
            if "agent_upgrade" in inv.features
            else f"release {wanted} is wanted but the agent runs {running} and cannot upgrade itself: "
            f"install opod {wanted} on the node and restart its worker"
        )
    labels = inv.all_labels()
    hw = node.hardware
    # Built from values already of the wire types' types: constructed, not validated (a listing of a
    # thousand nodes would otherwise validate every field of every node on each GET).
    return NodeView(
        id=node.id,
        hostname=node.hostname or hw.hostname or None,
        mgmt_addr=node.address or None,
        state=state_word(node, now, wall),
        labels=labels or None,
        operator_labels=inv.operator_labels or None,
        location=location_view(labels),
        gpu_total=len(devices),
        gpu_free=free,
        gpus=device_views or None,
        gpu_classes=list(by_class) or None,
        gpus_by_class=list(by_class.values()) or None,
        compute_capabilities=capabilities or None,
        unhealthy_gpus=[f"{d.label}: {d.why}" if d.why else d.label for d in devices if not d.healthy] or None,
        memory_gb=hw.ram_gb,
        cpu_count=hw.cpu_cores,
        os="/".join(part for part in (hw.os, hw.arch) if part) or None,
        disk_free_gb=hw.disk_free_gb,
        disk_total_gb=hw.disk_total_gb,
        engines=[node.engine_id] if node.engine_id else [],
        engine_versions=inv.engine_versions or None,
        engine_builds=inv.operator.engine_builds or None,
        warnings=warnings or None,
        models_on_disk=inv.models_on_disk,
        last_seen_ago=go_duration(silent_for(node, wall)) if inv.last_seen else None,
        agent_version=inv.agent_version or None,
        features=inv.features or None,
        replicas=_replicas(node),
        load=load_view(node, wall),
        provision=_provision(node),
        fabrics=list(inv.fabrics) or None,
        multi_node=inv.multi_node() or None,
        nvlink_domain=inv.nvlink_domain() or None,
    )


def _inputs(node: NodeState, held: set[int], now: float, wall: float) -> tuple[object, ...]:
    """Everything :func:`node_view` reads of a node, but the seconds since it was last heard from (see ``NodeList``)."""
    inv, op = node.inventory, node.inventory.operator
    return (
        node.address,
        node.hostname,
        node.hardware,
        node.engine_id,
        node.loaded_models,
        tuple(node.model_engines),
        inv.gpus,
        frozenset(held),
        state_word(node, now, wall),
        takes_new_work(node, now),
        tuple(inv.labels.items()),
        tuple(inv.operator_labels.items()),
        tuple(inv.engine_versions.items()),
        tuple(op.engine_builds.items()),
        op.wanted_version,
        tuple(inv.warnings),
        inv.agent_version,
        tuple(inv.features),
        None if inv.models_on_disk is None else tuple(inv.models_on_disk),
        bool(inv.last_seen),
        tuple(inv.provision),
        tuple((name, tuple(ports.items())) for name, ports in inv.fabrics.items()),
    )


class NodeList:
    """``GET /api/v1/nodes`` as JSON: each node's view is written again only when something it shows changed.

    A fleet of a thousand nodes is megabytes of views that mostly stay the same between two listings, so
    each node's JSON is kept with the inputs it was built from (:func:`_inputs`), and only the seconds
    since the node was last heard from, which change every listing, are written in afresh. Its ``load``
    changes with each heartbeat and is kept apart, with its report, its ``age_seconds`` written in afresh too.
    """

    def __init__(self) -> None:
        self._devices: DeviceViews = {}
        self._views: dict[str, tuple[tuple[object, ...], bytes]] = {}
        self._loads: dict[str, tuple[object, bytes]] = {}

    def _load_json(self, node: NodeState, wall: float) -> bytes:
        """``"load":{...}``, with the seconds since its report; the rest kept while the report is the same."""
        key = (node.host_load, node.hardware.cpu_cores, node.hardware.ram_gb)
        kept = self._loads.get(node.id)
        if kept is None or kept[0] != key:
            kept = (key, LOAD_VIEW.dump_json(load_view(node, None), exclude_none=True, by_alias=True))
            self._loads[node.id] = kept
        body = kept[1]
        if node.host_load is not None:
            body = _prefixed(body, b'"age_seconds":' + str(max(0, int(wall - node.host_load_at))).encode())
        return b'"load":' + body

    def json(self, nodes: list[NodeState], held: dict[str, set[int]], now: float, wall: float) -> bytes:
        parts = []
        for gone in self._views.keys() - {n.id for n in nodes}:
            del self._views[gone]
            self._devices.pop(gone, None)
            self._loads.pop(gone, None)
        for node in nodes:
            mine = held.get(node.id, set())
            inputs = _inputs(node, mine, now, wall)
            kept = self._views.get(node.id)
            if kept is None or kept[0] != inputs:
                view = node_view(node, mine, now, wall, self._devices)
                view.last_seen_ago = view.load = None
                kept = (inputs, NODE_VIEW.dump_json(view, exclude_none=True, by_alias=True))
                self._views[node.id] = kept
            body = _prefixed(kept[1], self._load_json(node, wall))
            if node.inventory.last_seen:
                body = _prefixed(body, b'"last_seen_ago":"' + go_duration(silent_for(node, wall)).encode() + b'"')
            parts.append(body)
        return b"[" + b",".join(parts) + b"]"


def _prefixed(obj: bytes, member: bytes) -> bytes:
    """A JSON object's text with ``member`` (``"key":value``) put first."""
    return b"{" + member + (b"}" if obj == b"{}" else b"," + obj[1:])
