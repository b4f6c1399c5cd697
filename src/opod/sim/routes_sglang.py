"""SGLang's own endpoints: health, server info (and its deprecated alias), model info, load, cache flush, metrics."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.sim.metrics import CONTENT_TYPE, SGLangCollector, registry_for, render
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["sglang_routes"]

VERSION = "0.5.0"
_JSON = "application/json"


def sglang_routes(state: SimState) -> list[Route]:
    engine = state.engine
    cfg = state.cfg
    registry = registry_for(SGLangCollector(engine))

    def server_args() -> dict[str, Any]:
        return {
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "served_model_name": cfg.model,
            "host": cfg.host,
            "port": cfg.port,
            "tp_size": 1,
            "pp_size": 1,
            "dp_size": 1,
            "max_running_requests": cfg.max_batch,
            "max_total_tokens": cfg.kv_blocks * cfg.block_size,
            "context_length": cfg.max_model_len,
            "page_size": cfg.block_size,
            "chunked_prefill_size": 8192,
            "schedule_policy": "fcfs",
            "mem_fraction_static": 0.88,
            "random_seed": cfg.seed,
            "enable_metrics": True,
            "kv_events_config": None
            if not cfg.kv_events
            else dumps({"publisher": "zmq", "endpoint": cfg.kv_events, "topic": cfg.kv_events_topic}).decode(),
        }

    async def health(request: Request) -> Response:
        return Response(status_code=503 if state.loading() else 200)

    async def server_info(request: Request) -> Response:
        args = server_args()
        capacity = cfg.kv_blocks * cfg.block_size
        internal = dict(args)
        internal.update(
            {
                "last_gen_throughput": 0.0,
                "memory_usage": {"kvcache": round(engine.kv_usage, 6), "token_capacity": capacity},
                "avg_spec_accept_length": None,
                "engine_paused": bool(engine.sleep_level),
                "waiting_queue_size": engine.waiting,
                "running_batch_size": engine.running,
            }
        )
        body = {
            **args,
            "status": "loading" if state.loading() else "ready",
            "max_total_num_tokens": capacity,
            "max_req_input_len": cfg.max_model_len - 1,
            "internal_states": [internal],
            "version": VERSION,
        }
        return Response(dumps(body), media_type=_JSON)

    async def model_info(request: Request) -> Response:
        body = {
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }
        return Response(dumps(body), media_type=_JSON)

    async def get_load(request: Request) -> Response:
        waiting = engine.waiting
        body = [
            {
                "dp_rank": 0,
                "num_reqs": engine.running + waiting,
                "num_waiting_reqs": waiting,
                "num_pages": engine.cache.held,
            }
        ]
        return Response(dumps(body), media_type=_JSON)

    async def flush_cache(request: Request) -> Response:
        ok = engine.reset_prefix_cache()
        if ok and state.publisher is not None:
            state.publisher.defer_cleared()
        return Response(
            "Cache flushed.\n" if ok else "Cache not flushed: requests are running.\n", status_code=200 if ok else 400
        )

    async def metrics(request: Request) -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/get_load", get_load, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
