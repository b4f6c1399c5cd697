"""Moving a model from one worker to another without a gap: load on the target, then unload from the source.

The source keeps serving until the target reports the model; if the target
never does within the limit, the move fails and the source is left as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time

from opod.http.errors import shown
from opod.leader.adminv1.context import AdminContext, AdminError
from opod.store.offloop import run_sync

log = logging.getLogger("opod.leader")

MOVE_LIMIT = 900.0


class Mover:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        self.moving: dict[str, asyncio.Task[None]] = {}

    async def start(self, model_id: str, source: str, target: str) -> dict[str, str]:
        ctx = self.ctx
        model = ctx.models.active(model_id)
        if model is None:
            raise AdminError(404, f"model {shown(model_id)} has not been added to this leader", "not_found")
        if not source or not target:
            raise AdminError(400, "move needs both `from` and `to` node ids")
        if source == target:
            raise AdminError(400, f"`from` and `to` are both {shown(source)}; name two different nodes")
        if model_id not in ctx.node(source).loaded_models:
            raise AdminError(
                409,
                f"node {shown(source)} does not hold {shown(model_id)}; GET /admin/v1/models shows where it is",
                "conflict",
            )
        ctx.node(target)
        if target not in [n.id for n in ctx.fleet.placeable()]:
            raise AdminError(
                409, f"node {shown(target)} is not taking work now (GET /admin/v1/nodes says why)", "conflict"
            )
        if model_id in self.moving and not self.moving[model_id].done():
            raise AdminError(
                409, f"{shown(model_id)} is already moving; wait for model.moved or model.move_failed", "conflict"
            )
        await run_sync(ctx.store.set_placement, model_id, target, "loaded")
        model.wanted[target] = "loaded"
        ctx.emit("model.move_started", model_id, {"from": source, "to": target})
        ctx.kick_reconciler()
        self.moving[model_id] = asyncio.get_running_loop().create_task(self._finish(model_id, source, target))
        return {"model": model_id, "from": source, "to": target, "status": "moving"}

    async def _finish(self, model_id: str, source: str, target: str) -> None:
        ctx = self.ctx
        model = ctx.models.get(model_id)
        deadline = time.monotonic() + MOVE_LIMIT
        while time.monotonic() < deadline:
            if any(n.id == target for n in ctx.fleet.workers_for(model_id)):
                break
            await asyncio.sleep(0.5)
        else:
            ctx.emit(
                "model.move_failed",
                model_id,
                {"from": source, "to": target, "reason": f"{target} did not report the model within {MOVE_LIMIT:.0f}s"},
            )
            return
        if model is not None:
            # "Not here" on the source; "anywhere" stays satisfied by the target.
            await run_sync(ctx.store.set_placement, model_id, source, "unloaded")
            model.wanted[source] = "unloaded"
        ctx.kick_reconciler()
        ctx.emit("model.moved", model_id, {"from": source, "to": target})
        log.info("moved %s from %s to %s", model_id, source, target)
