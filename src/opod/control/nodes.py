"""``/api/v1/nodes``: the workers the leader knows, and whether each takes work (the one liveness rule)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel

from opod.control.context import ControlContext
from opod.fleet.liveness import takes_new_work


class NodeView(BaseModel):
    id: str
    hostname: str
    mgmt_addr: str
    state: str
    memory_gb: int
    cpu_count: int
    engines: list[str]
    models: list[str]
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
            out.append(
                NodeView(
                    id=node.id,
                    hostname=node.hostname or node.hardware.hostname,
                    mgmt_addr=node.address,
                    state="ready" if live else why,
                    memory_gb=node.hardware.ram_gb,
                    cpu_count=node.hardware.cpu_cores,
                    engines=[node.engine_id] if node.engine_id else [],
                    models=sorted(node.loaded_models),
                    engine_state=node.engine.state if node.engine else "",
                    engine_detail=node.engine.detail if node.engine else "",
                    last_heartbeat_s=round(now - node.last_heartbeat, 1) if node.last_heartbeat else None,
                )
            )
        return out

    return api
