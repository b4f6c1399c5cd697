"""One simulator as an ASGI app, speaking the configured engine's dialect: :func:`sim_app` over a state, :func:`build_app` from a config."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from opod.sim.config import SimConfig
from opod.sim.control import control_routes
from opod.sim.errors import SimHTTPError, error_response
from opod.sim.openai_api import openai_routes
from opod.sim.routes_llamacpp import llamacpp_routes
from opod.sim.routes_lora import lora_routes
from opod.sim.routes_ollama import OllamaModels, ollama_routes, tagged
from opod.sim.routes_sglang import sglang_routes
from opod.sim.routes_vllm import vllm_routes
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["build_app", "sim_app"]


def _routes(state: SimState) -> list[BaseRoute]:
    dialect = state.cfg.dialect
    routes: list[BaseRoute] = [*control_routes(state)]
    if dialect == "ollama":
        models = OllamaModels(state)
        routes += openai_routes(state, lambda name: models.ensure_loaded(tagged(name)))
        routes += ollama_routes(state, models)
        return routes
    v1 = openai_routes(state)
    routes += v1
    if dialect == "vllm":
        routes += vllm_routes(state)
        if state.cfg.enable_lora:
            routes += lora_routes(state)
    elif dialect == "sglang":
        routes += sglang_routes(state)
    else:
        routes += llamacpp_routes(state)
        listing = next(r for r in v1 if isinstance(r, Route) and r.path == "/v1/models")
        routes.append(Route("/models", listing.endpoint, methods=["GET"]))
    return routes


def _not_found_handler(dialect: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Each engine answers an unknown path (or a wrong method) in its own way."""

    async def handler(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if dialect == "llamacpp":
            return error_response("llamacpp", SimHTTPError(404, "File Not Found", kind="not_found_error"))
        if dialect == "ollama":
            return PlainTextResponse(
                "404 page not found" if status == 404 else "405 method not allowed", status_code=status
            )
        detail = (
            "Not Found"
            if status == 404
            else "Method Not Allowed"
            if status == 405
            else str(getattr(exc, "detail", "error"))
        )
        return Response(dumps({"detail": detail}), status_code=status, media_type="application/json")

    return handler


def build_app(config: SimConfig) -> Starlette:
    """An ASGI app for ``config`` (validated here), to serve in-process. KV-event sockets open with the app's lifespan."""
    config.validate()
    return sim_app(SimState(config))


def sim_app(state: SimState) -> Starlette:
    """The ASGI app over one simulator's state; its lifespan starts the load phase and the KV-event sockets, and closes them."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading_now()
        if state.publisher is not None:
            state.publisher.start()
        try:
            yield
        finally:
            state.close()

    handler = _not_found_handler(state.cfg.dialect)
    return Starlette(routes=_routes(state), lifespan=lifespan, exception_handlers={404: handler, 405: handler})
