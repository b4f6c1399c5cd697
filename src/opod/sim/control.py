"""The simulator's own endpoints under ``/sim``: read and change faults, read the engine's state.

``POST /sim/faults`` takes any subset of the fault fields (see ``GET /sim/faults``)
and applies them at once, so a test can make a running simulator fail on demand:
``{"fail_next": 2}``, ``{"fail_rate": 0.3}``, ``{"stall_next": 1, "stall_ms": 500}``,
``{"crash_after": 0}`` (the next request ends the process) or
``{"crash_after_tokens": 3}`` (the next stream dies after 3 tokens).
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.sim.faults import FaultError
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["control_routes"]

_JSON = "application/json"


def control_routes(state: SimState) -> list[Route]:
    engine = state.engine
    cfg = state.cfg

    async def faults(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = json.loads(await request.body() or b"{}")
                state.faults.faults.update(body)
            except (ValueError, FaultError) as err:
                message = str(err) if isinstance(err, FaultError) else f"the body is not valid JSON ({err})"
                return Response(
                    dumps({"error": {"message": message, "type": "invalid_request_error", "code": 400}}),
                    status_code=400,
                    media_type=_JSON,
                )
        return Response(dumps(state.faults.faults.to_json()), media_type=_JSON)

    async def sim_state(request: Request) -> Response:
        s = engine.stats
        body = {
            "dialect": cfg.dialect,
            "models": list(cfg.models),
            "seed": cfg.seed,
            "loading": state.loading(),
            "sleeping": bool(engine.sleep_level),
            "running": engine.running,
            "waiting": engine.waiting,
            "kv_usage": engine.kv_usage,
            "kv_blocks": cfg.kv_blocks,
            "block_size": cfg.block_size,
            "cached_blocks": engine.cache.cached,
            "held_blocks": engine.cache.held,
            "arrivals": state.faults.arrivals,
            "requests": s.requests,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generation_tokens": s.generation_tokens,
            "kv_events": state.publisher.bound_endpoint if state.publisher and cfg.kv_events else None,
            "kv_events_replay": state.publisher.replay_bound_endpoint
            if state.publisher and cfg.kv_events_replay
            else None,
            "kv_events_bind": state.publisher.extra_bound_endpoint if state.publisher and cfg.kv_events_bind else None,
        }
        return Response(dumps(body), media_type=_JSON)

    return [
        Route("/sim/faults", faults, methods=["GET", "POST"]),
        Route("/sim/state", sim_state, methods=["GET"]),
    ]
