"""Ollama's native API: version, tags, ps, generate, chat (NDJSON streams), embed, show.

Models are ``name:tag`` (``:latest`` when no tag is given) and load on first use
(``--load-ms`` is the load time), then stay loaded for ``keep_alive``: 5 minutes
by default, for ever when negative, and unload right after the answer when 0.
Durations in answers are nanoseconds, as Ollama writes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.sim.embeddings import embed
from opod.sim.errors import SimHTTPError, error_response
from opod.sim.parse import GenRequest, embedding_inputs, read_json
from opod.sim.runner import TokenRun, make_plan
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["OllamaModels", "ollama_routes", "parse_keep_alive", "tagged"]

VERSION = "0.12.6"
DEFAULT_KEEP_ALIVE = 300.0
_FOREVER = float("inf")
_GO_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NDJSON = "application/x-ndjson"


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def parse_keep_alive(value: Any) -> float:
    """Seconds to stay loaded: a number of seconds or a Go duration; negative means for ever."""
    if value is None or value == "":
        return DEFAULT_KEEP_ALIVE
    if isinstance(value, bool):
        raise SimHTTPError(400, 'keep_alive must be a duration such as "5m" or a number of seconds')
    if isinstance(value, (int, float)):
        return _FOREVER if value < 0 else float(value)
    if isinstance(value, str):
        if value == "0":
            return 0.0
        if _GO_DURATION.match(value):
            total = sum(float(num) * _UNIT[unit] for num, unit in _PART.findall(value))
            return _FOREVER if value.startswith("-") else total
    raise SimHTTPError(
        400, f'keep_alive {value!r} is not a duration: use e.g. "5m", "1h", -1 (keep loaded) or 0 (unload now)'
    )


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class OllamaModels:
    """Which models are loaded, and until when."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.names = {tagged(m): m for m in state.cfg.models}
        self.loaded: dict[str, float] = {}

    def resolve(self, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise SimHTTPError(400, "model is required")
        full = tagged(name)
        if full not in self.names:
            raise SimHTTPError(404, f'model "{name}" not found, try pulling it first', code="model_not_found")
        return full

    def _expire(self) -> None:
        now = time.time()
        for name in [n for n, until in self.loaded.items() if until <= now]:
            del self.loaded[name]

    async def ensure_loaded(self, name: str) -> float:
        """Load ``name`` if needed; returns the seconds the load took."""
        self._expire()
        if name in self.loaded:
            return 0.0
        seconds = self.state.cfg.load_ms / 1000.0
        if seconds:
            await asyncio.sleep(seconds)
        self.loaded[name] = time.time() + DEFAULT_KEEP_ALIVE
        return seconds

    def keep(self, name: str, keep_alive: float) -> None:
        if keep_alive == 0:
            self.loaded.pop(name, None)
        else:
            self.loaded[name] = _FOREVER if keep_alive == _FOREVER else time.time() + keep_alive

    def ps(self) -> list[dict[str, Any]]:
        self._expire()
        out = []
        for name, until in self.loaded.items():
            # Ollama writes "for ever" as now plus the largest Go duration (about 292 years).
            expires = (
                datetime.now(UTC) + timedelta(microseconds=(2**63 - 1) // 1000)
                if until == _FOREVER
                else datetime.fromtimestamp(until, UTC)
            )
            out.append(
                {
                    **self.card(name),
                    "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "size_vram": 100_000_000,
                    "context_length": self.state.cfg.max_model_len,
                }
            )
        return out

    def card(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": _stamp(self.state.created),
            "size": 100_000_000,
            "digest": hashlib.sha256(name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "sim",
                "families": ["sim"],
                "parameter_size": "135M",
                "quantization_level": "Q4_0",
            },
        }


def ollama_routes(state: SimState, models: OllamaModels) -> list[Route]:
    engine = state.engine
    cfg = state.cfg
    tok = engine.tokenizer

    def fail(err: SimHTTPError) -> Response:
        return error_response("ollama", err)

    def budget(options: dict[str, Any], prompt: list[int]) -> int:
        room = cfg.max_model_len - len(prompt)
        n = options.get("num_predict")
        if n is None or (isinstance(n, int) and n < 0):
            return room
        if isinstance(n, bool) or not isinstance(n, int):
            raise SimHTTPError(400, f"options.num_predict must be an integer (got {n!r})")
        return max(min(n, room), 1)

    async def _generate(request: Request, chat: bool) -> Response:
        try:
            body = await read_json(request)
            name = models.resolve(body.get("model"))
            keep_alive = parse_keep_alive(body.get("keep_alive"))
            options = body.get("options") or {}
            if not isinstance(options, dict):
                raise SimHTTPError(400, "options must be an object")
            if chat:
                messages = body.get("messages") or []
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    raise SimHTTPError(400, 'messages must be a list of {"role", "content"} objects')
                empty = not messages
                prompt = tok.encode_chat(messages) if messages else []
                echo = str(messages[-1].get("content", "")) if messages else ""
            else:
                text = body.get("prompt") or ""
                if not isinstance(text, str):
                    raise SimHTTPError(400, "prompt must be a string")
                empty = not text
                turns = (
                    [{"role": "system", "content": body["system"]}] if isinstance(body.get("system"), str) else []
                ) + [{"role": "user", "content": text}]
                prompt = tok.encode(text) if body.get("raw") else tok.encode_chat(turns)
                echo = text
            if not empty and len(prompt) >= cfg.max_model_len:
                raise SimHTTPError(400, f"the prompt has {len(prompt)} tokens; the context holds {cfg.max_model_len}")
            max_tokens = budget(options, prompt) if not empty else 0
        except SimHTTPError as err:
            return fail(err)
        started = time.monotonic()
        load_s = await models.ensure_loaded(name)
        if empty:
            models.keep(name, keep_alive)
            reason = "unload" if keep_alive == 0 else "load"
            loaded: dict[str, Any] = {"model": name, "created_at": _stamp(time.time())}
            loaded.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
            loaded.update({"done": True, "done_reason": reason})
            return Response(dumps(loaded), media_type="application/json")
        decision = state.faults.on_request()
        if decision.fail:
            return fail(state.injected())
        seed = options.get("seed")
        req = GenRequest(
            model=name,
            prompt=prompt,
            max_tokens=max_tokens,
            asked_max_tokens=options.get("num_predict"),
            stream=body.get("stream", True) is not False,
            include_usage=False,
            seed=seed if isinstance(seed, int) else None,
            ignore_eos=False,
            min_tokens=0,
            echo_text=echo,
        )
        plan, _ = make_plan(engine, req, "ollama-chat" if chat else "ollama-generate")
        if not engine.fits(len(prompt), len(plan.ids)):
            return fail(
                SimHTTPError(
                    400, f"the request needs more KV blocks than the cache holds ({cfg.kv_blocks}, --kv-blocks)"
                )
            )
        run = TokenRun(engine, req, plan, decision)

        def line(piece: str, done: bool) -> dict[str, Any]:
            out: dict[str, Any] = {"model": name, "created_at": _stamp(time.time())}
            out.update({"message": {"role": "assistant", "content": piece}} if chat else {"response": piece})
            out["done"] = done
            if done:
                total = time.monotonic() - started
                out.update(
                    {
                        "done_reason": plan.finish_reason,
                        "total_duration": int(total * 1e9),
                        "load_duration": int(load_s * 1e9),
                        "prompt_eval_count": len(prompt),
                        "prompt_eval_duration": int(run.prompt_ms * 1e6),
                        "eval_count": run.sent,
                        "eval_duration": int(run.predicted_ms * 1e6),
                    }
                )
                if not chat:
                    out["context"] = prompt + plan.ids[: run.sent]
            return out

        if not req.stream:
            try:
                text = await run.run_all()
            finally:
                run.close()
                models.keep(name, keep_alive)
            return Response(dumps(line(text, True)), media_type="application/json")

        async def stream() -> AsyncIterator[bytes]:
            try:
                await run.start()
                while True:
                    state.faults.before_stream_token(run.sent)
                    piece = await run.next_piece()
                    if piece is None:
                        break
                    yield dumps(line(piece, False)) + b"\n"
                run.close()
                yield dumps(line("", True)) + b"\n"
            finally:
                run.close()
                models.keep(name, keep_alive)

        return StreamingResponse(stream(), media_type=_NDJSON)

    async def generate(request: Request) -> Response:
        return await _generate(request, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(request, chat=True)

    async def embed_route(request: Request) -> Response:
        legacy = request.url.path.endswith("/embeddings")
        try:
            body = await read_json(request)
            name = models.resolve(body.get("model"))
            keep_alive = parse_keep_alive(body.get("keep_alive"))
            texts = embedding_inputs(body.get("prompt" if legacy else "input"), "prompt" if legacy else "input")
        except SimHTTPError as err:
            return fail(err)
        started = time.monotonic()
        load_s = await models.ensure_loaded(name)
        if state.faults.on_request().fail:
            return fail(state.injected())
        models.keep(name, keep_alive)
        vectors = [embed(name, t, cfg.embedding_dim).tolist() for t in texts]
        if legacy:
            return Response(dumps({"embedding": vectors[0]}), media_type="application/json")
        count = sum(len(tok.encode(t)) for t in texts)
        out = {
            "model": name,
            "embeddings": vectors,
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": int(load_s * 1e9),
            "prompt_eval_count": count,
        }
        return Response(dumps(out), media_type="application/json")

    async def version(request: Request) -> Response:
        return Response(dumps({"version": VERSION}), media_type="application/json")

    async def tags(request: Request) -> Response:
        return Response(dumps({"models": [models.card(n) for n in models.names]}), media_type="application/json")

    async def ps(request: Request) -> Response:
        return Response(dumps({"models": models.ps()}), media_type="application/json")

    async def show(request: Request) -> Response:
        try:
            body = await read_json(request)
            name = models.resolve(body.get("model") or body.get("name"))
        except SimHTTPError as err:
            return fail(err)
        card = models.card(name)
        out = {
            "modelfile": f"FROM {name}\n",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": card["details"],
            "model_info": {
                "general.architecture": "sim",
                "sim.context_length": cfg.max_model_len,
                "sim.embedding_length": cfg.embedding_dim,
            },
            "capabilities": ["completion", "embedding"],
            "modified_at": card["modified_at"],
        }
        return Response(dumps(out), media_type="application/json")

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/version", version, methods=["GET"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/embed", embed_route, methods=["POST"]),
        Route("/api/embeddings", embed_route, methods=["POST"]),
        Route("/api/show", show, methods=["POST"]),
    ]
