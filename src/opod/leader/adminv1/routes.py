"""The ``/admin/v1`` handlers: version, capabilities, nodes, models, adapters, healthcheck, streams, shards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from opod import __version__
from opod.contract import adminapi, nodeapi
from opod.control.audit import audit_draft
from opod.fleet.liveness import model_states, takes_new_work
from opod.fleet.models import ANY_NODE
from opod.fleet.state import NodeState
from opod.http.errors import shown
from opod.http.nodeclient import WorkerUnavailable
from opod.leader import loadz
from opod.leader.adminv1.capabilities import capabilities
from opod.leader.adminv1.context import AdminContext, AdminError
from opod.leader.adminv1.moves import Mover
from opod.shards import ShardError
from opod.store.audit import AuditDraft
from opod.store.offloop import run_sync


def _wire(model: nodeapi.WireModel, status: int = 200) -> Response:
    return Response(model.to_json(), status_code=status, media_type="application/json")


class LoadRequest(BaseModel):
    node: str = ""


class MoveRequest(BaseModel):
    from_: str = ""
    to: str = ""

    model_config = {"populate_by_name": True, "alias_generator": lambda name: "from" if name == "from_" else name}


class AdapterRequest(BaseModel):
    base: str
    name: str
    source: str
    rank: int = 0
    node: str = ""


class ShardCreate(BaseModel):
    model: str
    shards: int | None = None


def node_view(node: NodeState, now: float) -> dict[str, Any]:
    live, why = takes_new_work(node, now)
    return {
        "id": node.id,
        "hostname": node.hostname or node.hardware.hostname,
        "address": node.address,
        "state": "ready" if live else why,
        "drained": node.drained,
        "sleeping": node.sleeping,
        "boot_id": node.boot_id,
        "engine": node.engine.to_wire() if node.engine is not None else None,
        "load": node.load.to_wire() if node.load is not None else None,
        "slots": node.slots,
        "loaded_models": sorted(node.loaded_models),
        "model_states": model_states(node, now),
        "resident_models": sorted(node.resident_models) if node.resident_models is not None else None,
        "last_heartbeat_s": round(now - node.last_heartbeat, 1) if node.last_heartbeat else None,
        "hardware": node.hardware.to_wire(),
    }


def router(ctx: AdminContext) -> APIRouter:
    api = APIRouter()
    mover = Mover(ctx)

    @api.get("/admin/v1/version")
    async def version() -> Response:
        return _wire(adminapi.Version(version=__version__, contract=adminapi.CONTRACT_VERSION))

    @api.get("/admin/v1/capabilities")
    async def get_capabilities() -> Response:
        # Worker certificates are verified only on a TLS listener.
        off = frozenset() if ctx.tls else frozenset({"tls_listener", "mtls"})
        return _wire(capabilities(off))

    @api.get("/admin/v1/nodes")
    async def nodes() -> JSONResponse:
        now = time.monotonic()
        return JSONResponse([node_view(n, now) for n in ctx.fleet])

    async def _sleep_or_resume(node_id: str, path: str) -> Response:
        node = ctx.node(node_id)
        try:
            status, body = await ctx.workers.call_json(node, "POST", path, timeout=60)
        except WorkerUnavailable as err:
            raise AdminError(503, str(err), "unavailable") from None
        if isinstance(body, dict):
            return JSONResponse(body, status_code=status)
        raise AdminError(status if status >= 400 else 502, f"worker {node_id}: {str(body).strip()}", "worker_error")

    @api.post("/admin/v1/nodes/{id}/sleep")
    async def sleep(id: str) -> Response:
        return await _sleep_or_resume(id, nodeapi.PATH_MODEL_SLEEP)

    @api.post("/admin/v1/nodes/{id}/resume")
    async def resume(id: str) -> Response:
        return await _sleep_or_resume(id, nodeapi.PATH_MODEL_RESUME)

    async def _drain(node_id: str, drained: bool, draft: AuditDraft) -> JSONResponse:
        # The management API's node state, one rule: drain is ``draining``, undrain is ``ready`` (a cordon ends too).
        ctx.node(node_id)
        await ctx.nodes.set_state(node_id, "drain" if drained else "ready", draft)
        return JSONResponse({"id": node_id, "drained": drained})

    @api.post("/admin/v1/nodes/{id}/drain")
    async def drain(id: str, draft: AuditDraft = Depends(audit_draft)) -> JSONResponse:
        return await _drain(id, True, draft)

    @api.post("/admin/v1/nodes/{id}/undrain")
    async def undrain(id: str, draft: AuditDraft = Depends(audit_draft)) -> JSONResponse:
        return await _drain(id, False, draft)

    @api.get("/admin/v1/models")
    async def models() -> JSONResponse:
        out = []
        for model in ctx.models:
            if model.removed:
                continue
            out.append(
                {
                    "id": model.id,
                    "capabilities": model.capabilities,
                    "wanted": dict(model.wanted),
                    "workers": [n.id for n in ctx.fleet.workers_for(model.id)],
                    "engine": model.engine,
                }
            )
        return JSONResponse(out)

    @api.post("/admin/v1/models/{id}/load")
    async def load(id: str, body: LoadRequest | None = None) -> JSONResponse:
        model_id = id
        model = ctx.models.active(model_id)
        if model is None:
            raise AdminError(
                404,
                f"model {shown(model_id)} has not been added to this leader (opod model add {model_id})",
                "not_found",
            )
        node = (body.node if body else "") or ANY_NODE
        if node != ANY_NODE:
            ctx.node(node)
        await run_sync(ctx.store.set_placement, model_id, node, "loaded")
        model.wanted[node] = "loaded"
        ctx.kick_reconciler()
        serving = [n.id for n in ctx.fleet.workers_for(model_id)]
        return JSONResponse(
            {"model": model_id, "node": node, "status": "serving" if serving else "loading", "workers": serving},
            status_code=202,
        )

    @api.post("/admin/v1/models/{id}/move")
    async def move(id: str, body: MoveRequest) -> JSONResponse:
        return JSONResponse(await mover.start(id, body.from_, body.to), status_code=202)

    @api.post("/admin/v1/adapters")
    async def adapters_load(body: AdapterRequest) -> JSONResponse:
        req = nodeapi.LoadAdapterRequest(base=body.base, name=body.name, source=body.source, rank=body.rank)
        return await _adapters(body.base, body.node, nodeapi.PATH_ADAPTERS_LOAD, req)

    @api.delete("/admin/v1/adapters/{name}")
    async def adapters_unload(
        name: str, base: str = Query(..., description="The model the adapter is attached to.")
    ) -> JSONResponse:
        return await _adapters(
            base, "", nodeapi.PATH_ADAPTERS_UNLOAD, nodeapi.UnloadAdapterRequest(base=base, name=name)
        )

    async def _adapters(base: str, node_id: str, path: str, req: nodeapi.WireModel) -> JSONResponse:
        holders = [ctx.node(node_id)] if node_id else ctx.fleet.workers_for(base)
        if not holders:
            raise AdminError(409, f"no live worker holds {shown(base)}; load it first", "conflict")
        results: list[dict[str, Any]] = []
        worst = 0
        for node in holders:
            try:
                status, answer = await ctx.workers.call_json(node, "POST", path, req.to_wire(), timeout=120)
            except WorkerUnavailable as err:
                status, answer = 503, str(err)
            worst = max(worst, status)
            results.append(
                {
                    "node": node.id,
                    "status": status,
                    "answer": answer if isinstance(answer, dict) else str(answer).strip(),
                }
            )
        return JSONResponse({"results": results}, status_code=200 if worst < 400 else worst)

    @api.post("/admin/v1/healthcheck")
    async def healthcheck() -> JSONResponse:
        now = time.monotonic()

        async def probe(node: NodeState) -> dict[str, Any]:
            started = time.perf_counter()
            try:
                async with ctx.workers.session.get(
                    node.base_url() + "/healthz", timeout=aiohttp.ClientTimeout(total=3)
                ) as resp:
                    ok = resp.status == 200
                    error = "" if ok else f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                ok, error = False, str(err) or type(err).__name__
            live, why = takes_new_work(node, now)
            return {
                "id": node.id,
                "reachable": ok,
                "latency_ms": round((time.perf_counter() - started) * 1000, 1),
                "error": error,
                "takes_work": live,
                "reason": why,
                "engine": node.engine.to_wire() if node.engine is not None else None,
            }

        results = await asyncio.gather(*(probe(n) for n in ctx.fleet))
        return JSONResponse({"nodes": list(results), "healthy": all(r["reachable"] for r in results)})

    def _paging(after: int, limit: int | None) -> None:
        if after < 0:
            raise AdminError(400, "after must be a cursor id ≥ 0 (the `next` of the previous page)")
        if limit is not None and limit < 0:
            raise AdminError(400, "limit must be between 1 and 1000 (0 or absent = 500; more than 1000 reads as 1000)")

    @api.get("/admin/v1/usage/stream")
    async def usage_stream(after: int = 0, limit: int | None = None) -> Response:
        _paging(after, limit)
        return _wire(await ctx.ledger.usage_page(after, limit))

    @api.get("/admin/v1/events/stream")
    async def events_stream(after: int = 0, limit: int | None = None) -> Response:
        _paging(after, limit)
        return _wire(await ctx.ledger.events_page(after, limit))

    async def _shard_call(op: Callable[..., Awaitable[Any]], *args: Any, status: int = 200) -> JSONResponse:
        try:
            result = await op(*args)
        except ShardError as err:
            return JSONResponse(err.to_body(), status_code=err.status)
        await run_sync(ctx.store.set_meta, "shards", ctx.shards.to_json())  # gangs survive a leader restart
        if isinstance(result, list):
            return JSONResponse([g.model_dump(mode="json") for g in result], status_code=status)
        return JSONResponse(result.model_dump(mode="json"), status_code=status)

    @api.get("/admin/v1/shards")
    async def shards_list() -> JSONResponse:
        return await _shard_call(ctx.shards.list)

    @api.post("/admin/v1/shards/create")
    async def shards_create(body: ShardCreate) -> JSONResponse:
        return await _shard_call(ctx.shards.create, body.model, body.shards, status=201)

    @api.delete("/admin/v1/shards/{model_id}")
    async def shards_delete(model_id: str) -> JSONResponse:
        return await _shard_call(ctx.shards.delete, model_id)

    @api.delete("/admin/v1/shards/{model_id}/{gang_id}")
    async def shards_delete_gang(model_id: str, gang_id: str) -> JSONResponse:
        return await _shard_call(ctx.shards.delete_gang, model_id, gang_id)

    return api


def loadz_response(ctx: AdminContext) -> Response:
    return _wire(loadz.compute(ctx.fleet, ctx.stats, ctx.plan(), ctx.prefix_index()))
