"""``/api/v1/nodes``: the workers the leader knows, and whether each takes work (the one liveness rule)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from opod.access.offloop import run_sync
from opod.contract import nodeapi
from opod.control.context import ControlContext, ControlError
from opod.fleet.liveness import model_states, takes_new_work


class GPUView(BaseModel):
    """One card as the worker reported it at registration (its name and whole GiB of memory)."""

    model_config = ConfigDict(populate_by_name=True)

    index: int
    name: str
    label: str
    """The card as people are shown it: its index."""
    class_: str = Field(alias="class")
    """The card's model name: the worker reports no finer class (no MIG profiles)."""
    card: int
    memory_total_mb: int
    """The worker reports whole GiB (rounded down), so this is that times 1024."""


def gpu_views(gpus: list[nodeapi.GPU] | None) -> list[GPUView]:
    return [GPUView(index=i, name=g.name, label=str(i), class_=g.name, card=i, memory_total_mb=g.vram_gb * 1024)
            for i, g in enumerate(gpus or [])]


class NodeView(BaseModel):
    id: str
    hostname: str
    mgmt_addr: str
    state: str
    memory_gb: int
    cpu_count: int
    os: str = ""
    """Operating system and architecture, as the worker read them (``linux/amd64``)."""
    disk_free_gb: int = 0
    """Free space where the worker keeps weights, GiB, as of its last heartbeat; 0 = not reported (unknown, not full)."""
    disk_total_gb: int = 0
    gpu_total: int = 0
    gpus: list[GPUView] = []
    gpu_classes: list[str] = []
    """The cards' model names, each once, in the order the cards come."""
    engines: list[str]
    models: list[str]
    model_states: dict[str, str] = {}
    """Each model the worker holds or says anything of: ``serving``, or why it cannot (as its clients are told)."""
    engine_state: str = ""
    engine_detail: str = ""
    last_heartbeat_s: float | None = None


def router(ctx: ControlContext) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/nodes", response_model=list[NodeView])
    async def get_nodes() -> list[NodeView]:
        now = time.monotonic()
        out = []
        for node in ctx.fleet:
            live, why = takes_new_work(node, now)
            gpus = gpu_views(node.hardware.gpus)
            out.append(
                NodeView(
                    id=node.id,
                    hostname=node.hostname or node.hardware.hostname,
                    mgmt_addr=node.address,
                    state="ready" if live else why,
                    memory_gb=node.hardware.ram_gb,
                    cpu_count=node.hardware.cpu_cores,
                    os="/".join(part for part in (node.hardware.os, node.hardware.arch) if part),
                    disk_free_gb=node.hardware.disk_free_gb,
                    disk_total_gb=node.hardware.disk_total_gb,
                    gpu_total=len(gpus),
                    gpus=gpus,
                    gpu_classes=list(dict.fromkeys(g.class_ for g in gpus)),
                    engines=[node.engine_id] if node.engine_id else [],
                    models=sorted(node.loaded_models),
                    model_states=model_states(node, now),
                    engine_state=node.engine.state if node.engine else "",
                    engine_detail=node.engine.detail if node.engine else "",
                    last_heartbeat_s=round(now - node.last_heartbeat, 1) if node.last_heartbeat else None,
                )
            )
        return out

    @api.delete("/api/v1/nodes/{node_id}")
    async def delete_node(node_id: str) -> dict:
        """Forget a node that has gone; a live node serving models must be drained or stopped first."""
        node = ctx.fleet.get(node_id)
        if node is None:
            raise ControlError(404, f"node {node_id!r} is not known; `opod node ls` lists them")
        live, _ = takes_new_work(node, time.monotonic())
        if live and node.loaded_models:
            raise ControlError(409, f"node {node_id!r} is live and serving {', '.join(sorted(node.loaded_models))}; stop its worker first")
        await run_sync(ctx.store.delete_node, node_id)
        ctx.fleet.remove(node_id)
        ctx.access.forget_node(node_id)
        ctx.forget_node(node_id)
        ctx.emit("node.removed", node_id, {})
        return {"removed": node_id}

    return api
