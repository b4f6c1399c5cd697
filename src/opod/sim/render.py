"""vLLM's ``POST /v1/chat/completions/render``: a chat request turned into token ids, not run.

vLLM 0.32 serves it with ``--enable-scale-out``; vllm-router's ``kv_aware``
policy calls it on every candidate worker and matches the ``token_ids`` against
the blocks that worker's KV events announced. The ids here come from the very
parse a chat request goes through (``parse_chat``), so they are the ids the
prefix cache stores and the events publish, block for block.
"""

from __future__ import annotations

from typing import Any

from opod.sim.errors import bad_request
from opod.sim.parse import GenRequest
from opod.sim.textgen import request_rng

__all__ = ["render_body"]

_DEFAULTS = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
}
"""vLLM's sampling defaults, used where the request leaves a value out."""
_OUTPUT_KIND = {True: 1, False: 2}
"""vLLM's RequestOutputKind: DELTA (1) for a stream, FINAL_ONLY (2) otherwise."""


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise bad_request("stop", "`stop` must be a string or a list of strings")


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(name, f"`{name}` must be a number (got {value!r})")
    return float(value)


def render_body(req: GenRequest, body: dict[str, Any], seed: int) -> dict[str, Any]:
    """The reply, key for key in vLLM's order; ``req`` is the parsed chat request, ``body`` what was sent."""
    rng = request_rng(seed, req.prompt, f"render|{req.model}")
    sampling: dict[str, object] = {name: _number(body, name, default) for name, default in _DEFAULTS.items()}
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise bad_request("stop_token_ids", "`stop_token_ids` must be a list of integer token ids")
    sampling.update(
        {
            "stop": _stop(body),
            "stop_token_ids": stop_ids,
            "max_tokens": req.max_tokens,
            "output_kind": _OUTPUT_KIND[req.stream],
            "skip_clone": True,
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        }
    )
    return {
        "request_id": f"chatcmpl-{rng.getrandbits(64):016x}",
        "token_ids": req.prompt,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling,
        "model": req.model,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": req.stream,
        "stream_options": body.get("stream_options") if req.stream else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority") if isinstance(body.get("priority"), int) else 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }
