"""llama-server's own endpoints: health with its load phase, props, slots, tokenize, detokenize, apply-template, metrics."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.contract.tokenizer import BOS, render_chat
from opod.sim.errors import SimHTTPError, bad_request
from opod.sim.metrics_llamacpp import LlamaCppMetrics
from opod.sim.parse import read_json
from opod.sim.shapes import dumps
from opod.sim.state import SimState

__all__ = ["llamacpp_routes"]

_JSON = "application/json"
_TEMPLATE = (
    "{{ '<s>' }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
_PARAMS = {
    "seed": 4294967295,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "max_tokens": -1,
    "n_predict": -1,
    "stream": False,
    "samplers": ["top_k", "top_p", "min_p", "temperature"],
}


def llamacpp_routes(state: SimState) -> list[Route]:
    engine = state.engine
    cfg = state.cfg
    metrics_text = LlamaCppMetrics(engine)

    def loading() -> Response | None:
        if state.loading():
            return state.error(SimHTTPError(503, "Loading model", kind="unavailable_error"))
        return None

    async def health(request: Request) -> Response:
        return loading() or Response(dumps({"status": "ok"}), media_type=_JSON)

    async def props(request: Request) -> Response:
        if request.method == "POST":
            return state.error(
                SimHTTPError(501, "This server does not support changing global properties. Start it with `--props`")
            )
        body = {
            "default_generation_settings": {"params": _PARAMS, "n_ctx": cfg.max_model_len},
            "total_slots": cfg.max_batch,
            "model_alias": cfg.model,
            "model_ftype": "sim",
            "model_path": f"opod-sim/{cfg.model}.gguf",
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": True,
            "ui": False,
            "ui_settings": {},
            "chat_template": _TEMPLATE,
            "chat_template_caps": {
                "supports_string_content": True,
                "supports_system_role": True,
                "supports_tool_calls": False,
                "supports_tools": False,
            },
            "bos_token": "<s>",
            "eos_token": "</s>",
            "build_info": "b1-opodsim",
            "is_sleeping": False,
            "cors_proxy_enabled": False,
        }
        return loading() or Response(dumps(body), media_type=_JSON)

    async def slots(request: Request) -> Response:
        early = loading()
        if early is not None:
            return early
        table = engine.slot_table()
        if request.query_params.get("fail_on_no_slot") and all(s is not None for s in table):
            return state.error(SimHTTPError(503, "no slot available", kind="unavailable_error"))
        out: list[dict[str, Any]] = []
        for i, seq in enumerate(table):
            slot: dict[str, Any] = {
                "id": i,
                "n_ctx": cfg.max_model_len,
                "speculative": False,
                "is_processing": seq is not None,
            }
            if seq is None:
                slot.update(
                    {"id_task": -1, "n_prompt_tokens": 0, "n_prompt_tokens_processed": 0, "n_prompt_tokens_cache": 0}
                )
                remain, decoded, more = -1, 0, False
            else:
                slot.update(
                    {
                        "id_task": seq.task_id,
                        "n_prompt_tokens": seq.prompt_tokens,
                        "n_prompt_tokens_processed": seq.prompt_tokens - seq.cached_tokens,
                        "n_prompt_tokens_cache": seq.cached_tokens,
                    }
                )
                remain, decoded, more = len(seq.plan.ids) - seq.produced, seq.produced, True
            slot["params"] = _PARAMS
            slot["next_token"] = [
                {"has_next_token": more, "has_new_line": False, "n_remain": remain, "n_decoded": decoded}
            ]
            out.append(slot)
        return Response(dumps(out), media_type=_JSON)

    async def tokenize(request: Request) -> Response:
        try:
            body = await read_json(request)
            content = body.get("content")
            if not isinstance(content, str):
                raise bad_request("content", "`content` (a string) is required")
        except SimHTTPError as err:
            return state.error(err)
        tok = engine.tokenizer
        ids = tok.encode(content)
        if body.get("add_special") and ids[:1] != [BOS]:
            ids.insert(0, BOS)  # a rendered chat template already starts with it
        tokens: list[Any] = ids
        if body.get("with_pieces"):
            tokens = [{"id": i, "piece": p} for i, p in zip(ids, tok.token_strs(ids))]
        return Response(dumps({"tokens": tokens}), media_type=_JSON)

    async def detokenize(request: Request) -> Response:
        try:
            body = await read_json(request)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise bad_request("tokens", "`tokens` must be a list of integer token ids")
        except SimHTTPError as err:
            return state.error(err)
        return Response(dumps({"content": engine.tokenizer.decode(tokens)}), media_type=_JSON)

    async def apply_template(request: Request) -> Response:
        try:
            body = await read_json(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise bad_request("messages", '\'messages\' is required: a list of {"role", "content"} objects')
        except SimHTTPError as err:
            return state.error(err)
        return Response(dumps({"prompt": render_chat(messages)}), media_type=_JSON)

    async def metrics(request: Request) -> Response:
        return loading() or Response(metrics_text.render(), media_type="text/plain; version=0.0.4")

    return [
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/props", props, methods=["GET", "POST"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
