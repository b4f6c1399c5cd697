"""vLLM's own endpoints (0.32, dev mode and scale-out on): health, version, load, tokenize, chat render, sleep, prefix-cache reset, metrics."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.sim.errors import SimHTTPError, bad_request
from opod.sim.metrics import CONTENT_TYPE, VLLMCollector, registry_for, render
from opod.sim.parse import parse_chat, read_json, resolve_model
from opod.sim.render import render_body
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["tokenize_body", "vllm_routes"]

VERSION = "0.32.0"
_JSON = "application/json"


def tokenize_body(state: SimState, body: dict[str, Any]) -> list[int]:
    """vLLM's ``/tokenize`` input: ``messages`` (chat template applied) or ``prompt``."""
    tok = state.engine.tokenizer
    if body.get("messages") is not None:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise bad_request("messages", '`messages` must be a list of {"role", "content"} objects')
        return tok.encode_chat(messages, add_generation_prompt=body.get("add_generation_prompt", True) is not False)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt", "send `prompt` (a string) or `messages` (a chat) to tokenize")
    return tok.encode(prompt)


def vllm_routes(state: SimState) -> list[Route]:
    engine = state.engine
    cfg = state.cfg
    registry = registry_for(VLLMCollector(engine))

    async def health(request: Request) -> Response:
        # vLLM answers 200 with an empty body, asleep or not; the load phase is the only 503.
        return Response(status_code=503 if state.loading() else 200)

    async def version(request: Request) -> Response:
        return Response(dumps({"version": VERSION}), media_type=_JSON)

    async def load(request: Request) -> Response:
        return Response(dumps({"server_load": engine.running + engine.waiting}), media_type=_JSON)

    async def kv_event_sources(request: Request) -> Response:
        if not (cfg.kv_events or cfg.kv_events_bind):
            return Response(b"{}", media_type=_JSON)
        source = {
            # The bound endpoint when there is one: it is the one an outside subscriber can dial.
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": cfg.kv_events_bind or cfg.kv_events,
            "replay_endpoint": cfg.kv_events_replay or None,
            "buffer_steps": cfg.kv_events_buffer,
            "hwm": 100000,
            "max_queue_size": 100000,
            "topic": cfg.kv_events_topic,
        }
        return Response(dumps({"0": source}), media_type=_JSON)

    async def tokenize(request: Request) -> Response:
        try:
            body = await read_json(request)
            resolve_model(body, cfg.models, default=cfg.model)
            ids = tokenize_body(state, body)
        except SimHTTPError as err:
            return state.error(err)
        strs = engine.tokenizer.token_strs(ids) if body.get("return_token_strs") else None
        return Response(
            dumps({"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": strs}),
            media_type=_JSON,
        )

    async def render_chat(request: Request) -> Response:
        # Always served here; a real vLLM answers 403 unless started with --enable-scale-out.
        try:
            body = await read_json(request)
            reply = render_body(parse_chat(body, state.served, engine.tokenizer, cfg.max_model_len), body, cfg.seed)
        except SimHTTPError as err:
            return state.error(err)
        return Response(dumps(reply), media_type=_JSON)

    async def detokenize(request: Request) -> Response:
        try:
            body = await read_json(request)
            resolve_model(body, cfg.models, default=cfg.model)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise bad_request("tokens", "`tokens` must be a list of integer token ids")
        except SimHTTPError as err:
            return state.error(err)
        return Response(dumps({"prompt": engine.tokenizer.decode(tokens)}), media_type=_JSON)

    async def sleep(request: Request) -> Response:
        raw = request.query_params.get("level", "1")
        if raw not in ("0", "1", "2"):
            return state.error(bad_request("level", f"level must be 0, 1 or 2 (got {raw!r})"))
        engine.sleep(int(raw))
        if state.publisher is not None:
            state.publisher.defer_cleared()
        return Response(dumps({"status": "sleeping", "level": int(raw)}), media_type=_JSON)

    async def wake_up(request: Request) -> Response:
        engine.wake()
        return Response(
            dumps({"status": "awake", "tags": request.query_params.getlist("tags") or None}), media_type=_JSON
        )

    async def is_sleeping(request: Request) -> Response:
        return Response(dumps({"is_sleeping": bool(engine.sleep_level)}), media_type=_JSON)

    async def reset_prefix_cache(request: Request) -> Response:
        ok = engine.reset_prefix_cache()
        if ok and state.publisher is not None:
            state.publisher.defer_cleared()
        return Response(dumps({"success": ok}), media_type=_JSON)

    async def metrics(request: Request) -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/version", version, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/kv_event_sources", kv_event_sources, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/chat/completions/render", render_chat, methods=["POST"]),
        Route("/sleep", sleep, methods=["POST"]),
        Route("/wake_up", wake_up, methods=["POST"]),
        Route("/is_sleeping", is_sleeping, methods=["GET"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
