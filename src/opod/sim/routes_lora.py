"""vLLM's runtime LoRA API (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): attach and detach adapters.

An attached adapter is served under its ``lora_name`` over the first model:
requests may name it, and ``/v1/models`` lists it with its path as ``root``
and the base as ``parent``. Answers are vLLM's: plain text on success, its
JSON error shape otherwise. The simulator loads no weights, so any path is
accepted. An adapter's cached blocks are its own (see :mod:`opod.sim.prefix_cache`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from opod.sim.errors import SimHTTPError, bad_request
from opod.sim.parse import read_json
from opod.sim.state import SimState

__all__ = ["lora_routes"]


def _strings(body: dict[str, Any], *keys: str) -> dict[str, str]:
    """The named fields, each a non-empty string; a 400 naming the first that is not."""
    out = {}
    for key in keys:
        value = body.get(key)
        if not isinstance(value, str) or not value:
            raise bad_request(key, f"`{key}` is required and must be a non-empty string")
        out[key] = value
    return out


def lora_routes(state: SimState) -> list[Route]:
    async def load(request: Request) -> Response:
        try:
            fields = _strings(await read_json(request), "lora_name", "lora_path")
            name = fields["lora_name"]
            if name in state.adapters or name in state.cfg.models:
                raise SimHTTPError(400, f"The lora adapter '{name}' has already been loaded.", kind="InvalidUserInput")
        except SimHTTPError as err:
            return state.error(err)
        state.attach(name, fields["lora_path"])
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> Response:
        try:
            name = _strings(await read_json(request), "lora_name")["lora_name"]
            if name not in state.adapters:
                raise SimHTTPError(404, f"The lora adapter '{name}' cannot be found.", kind="NotFoundError")
        except SimHTTPError as err:
            return state.error(err)
        state.detach(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    return [
        Route("/v1/load_lora_adapter", load, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
    ]
