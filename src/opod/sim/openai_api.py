"""The OpenAI routes every dialect serves: models, chat and text completions, embeddings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opod.sim import rerank
from opod.sim.embeddings import embed, encode_base64
from opod.sim.errors import SimHTTPError, bad_request
from opod.sim.parse import embedding_inputs, parse_chat, parse_completion, read_json, resolve_model
from opod.sim.runner import TokenRun, make_plan
from opod.sim.shapes import Answer, Choice, dumps, sse, tool_call_delta
from opod.sim.state import SimState
from opod.sim.textgen import Plan

__all__ = ["MANY_CHOICES", "openai_routes", "unavailable_while_loading"]

_DONE = b"data: [DONE]\n\n"
_JSON = "application/json"
MANY_CHOICES = frozenset({"vllm", "sglang"})
"""Dialects whose engine answers ``n`` > 1 choices in one request."""


def _tool_calls(plan: Plan) -> list[dict[str, Any]] | None:
    """A plan's tool calls as OpenAI's ``message.tool_calls``; ``None`` for a text answer."""
    if not plan.calls:
        return None
    return [
        {
            "id": span.id,
            "type": "function",
            "function": {"name": span.name, "arguments": "".join(plan.pieces[span.start : span.end])},
        }
        for span in plan.calls
    ]


def unavailable_while_loading(state: SimState) -> Response | None:
    if not state.loading():
        return None
    if state.cfg.dialect == "llamacpp":
        return state.error(SimHTTPError(503, "Loading model", kind="unavailable_error"))
    return state.error(SimHTTPError(503, "the model is still loading; retry shortly"))


def openai_routes(state: SimState, before_answer: Callable[[str], Awaitable[object]] | None = None) -> list[Route]:
    """``before_answer`` gets each request's model before the work starts (Ollama loads it there)."""
    engine = state.engine
    cfg = state.cfg
    shape = state.shape
    tokenizer = engine.tokenizer
    extra_headers = {"X-Accel-Buffering": "no"} if cfg.dialect == "llamacpp" else None

    async def models(request: Request) -> Response:
        listing = shape.models(state.listed, state.created, cfg.max_model_len, cfg.embedding_dim)
        for card in listing["data"] if state.adapters else ():
            if card["id"] in state.adapters:  # vLLM lists an adapter with its path as root and the base as parent
                card.update(root=state.adapters[card["id"]], parent=cfg.models[0])
        return Response(dumps(listing), media_type=_JSON)

    async def _generate(request: Request, kind: str) -> Response:
        early = unavailable_while_loading(state)
        if early is not None:
            return early
        try:
            body = await read_json(request)
            if kind == "chat":
                req = parse_chat(body, state.served, tokenizer, cfg.max_model_len)
            else:
                req = parse_completion(
                    body, state.served, tokenizer, cfg.max_model_len, add_bos=cfg.dialect == "llamacpp"
                )
            if req.n > 1 and cfg.dialect not in MANY_CHOICES:
                raise bad_request(
                    "n",
                    f"n={req.n} is not supported by {cfg.dialect}: it answers one choice per request; send n=1 or leave it out",
                )
        except SimHTTPError as err:
            return state.error(err)
        decision = state.faults.on_request()
        if decision.fail:
            return state.error(state.injected())
        plans = [make_plan(engine, req, kind, i) for i in range(req.n)]
        rng = plans[0][1]
        answer_tokens = sum(len(plan.ids) for plan, _ in plans)
        if not engine.fits(len(req.prompt), answer_tokens):
            return state.error(
                SimHTTPError(
                    400,
                    f"the request needs {engine.cache.blocks_for(len(req.prompt) + answer_tokens)} KV blocks but the cache holds "
                    f"{cfg.kv_blocks} (--kv-blocks); send a shorter prompt or a lower max_tokens",
                    param="input_tokens",
                )
            )
        if before_answer is not None:
            await before_answer(req.model)
        answer = Answer(shape.new_id(kind, rng), int(time.time()), req.model, len(req.prompt), 0, req.include_usage)
        runs = [TokenRun(engine, req, plan, decision) for plan, _ in plans]
        if req.stream:
            gen = _stream(runs, answer, kind)
            return StreamingResponse(gen, media_type="text/event-stream", headers=extra_headers)
        try:
            texts = await asyncio.gather(*(run.run_all() for run in runs))
        finally:
            for run in runs:
                run.close()
        _settle(answer, runs)
        choices = [
            Choice(i, text, run.plan.finish_reason, _tool_calls(run.plan))
            for i, (run, text) in enumerate(zip(runs, texts, strict=True))
        ]
        body_out = shape.chat_choices(answer, choices) if kind == "chat" else shape.completion_choices(answer, choices)
        return Response(dumps(body_out), media_type=_JSON)

    def _settle(answer: Answer, runs: list[TokenRun]) -> None:
        first = runs[0]
        answer.cached_tokens = first.cached_tokens
        answer.completion_tokens = sum(run.sent for run in runs)
        answer.finish_reason = first.plan.finish_reason
        answer.prompt_ms = first.prompt_ms
        answer.predicted_ms = first.predicted_ms

    def _piece_chunks(answer: Answer, run: TokenRun, index: int, piece: str, chat: bool) -> list[dict[str, Any]]:
        """The chunks one piece goes out in: text, or a tool call's argument text (after the chunk naming the call)."""
        plan = run.plan
        at = run.sent - 1
        finish = plan.finish_reason if at == len(plan.pieces) - 1 else None
        if not plan.calls:
            return [(shape.chat_token if chat else shape.completion_token)(answer, piece, finish, index)]
        out = []
        k = next(k for k, span in enumerate(plan.calls) if span.start <= at < span.end)
        span = plan.calls[k]
        if at == span.start:
            out.append(shape.chat_delta(answer, tool_call_delta(k, call_id=span.id, name=span.name), None, index))
        out.append(shape.chat_delta(answer, tool_call_delta(k, arguments=piece), finish, index))
        return out

    async def _stream(runs: list[TokenRun], answer: Answer, kind: str) -> AsyncIterator[bytes]:
        chat = kind == "chat"
        faults = state.faults
        try:
            for run in runs:
                await run.start()
            answer.cached_tokens = runs[0].cached_tokens
            for index in range(len(runs)):
                for chunk in shape.chat_start(answer, index) if chat else shape.completion_start(answer, index):
                    yield sse(chunk)
            active = list(enumerate(runs))
            while active:
                for index, run in list(active):
                    faults.before_stream_token(run.sent)
                    piece = await run.next_piece()
                    if piece is None:
                        active.remove((index, run))
                        continue
                    for chunk in _piece_chunks(answer, run, index, piece, chat):
                        yield sse(chunk)
            for run in runs:
                run.close()
            _settle(answer, runs)
            for chunk in shape.stream_end(answer, "chat.completion.chunk" if chat else "text_completion"):
                yield sse(chunk)
            yield _DONE
        finally:
            for run in runs:
                run.close()

    async def chat(request: Request) -> Response:
        return await _generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await _generate(request, "completion")

    async def embeddings(request: Request) -> Response:
        early = unavailable_while_loading(state)
        if early is not None:
            return early
        try:
            body = await read_json(request)
            model = resolve_model(body, state.served)
            texts = embedding_inputs(body.get("input"))
            dim = body.get("dimensions") or cfg.embedding_dim
            if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
                raise bad_request("dimensions", f"`dimensions` must be an integer between 1 and 65536 (got {dim!r})")
            fmt = body.get("encoding_format") or "float"
            if fmt not in ("float", "base64"):
                raise bad_request("encoding_format", f"`encoding_format` must be float or base64 (got {fmt!r})")
        except SimHTTPError as err:
            return state.error(err)
        if state.faults.on_request().fail:
            return state.error(state.injected())
        if before_answer is not None:
            await before_answer(model)
        prompt_tokens = sum(len(tokenizer.encode(t)) for t in texts)
        engine.stats.embedding_requests += 1
        data: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            v = embed(model, text, dim)
            item: dict[str, Any] = {
                "index": i,
                "object": "embedding",
                "embedding": encode_base64(v) if fmt == "base64" else v.tolist(),
            }
            data.append(item)
        out = {
            "id": f"embd-{state.faults.arrivals:016x}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
        return Response(dumps(out), media_type=_JSON)

    async def rerank_route(request: Request) -> Response:
        early = unavailable_while_loading(state)
        if early is not None:
            return early
        try:
            body = await read_json(request)
            model = resolve_model(body, state.served)
            problem = rerank.check(body)
            if problem is not None:
                raise bad_request("documents" if "documents" in problem else "query", problem)
        except SimHTTPError as err:
            return state.error(err)
        if state.faults.on_request().fail:
            return state.error(state.injected())
        answer = rerank.rerank(body, model, lambda text: len(tokenizer.encode(text)))
        return Response(rerank.dumps(answer), media_type=_JSON)

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/rerank", rerank_route, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
    ]
