"""OpenAI response bodies and stream chunks, shaped like each engine writes them.

vLLM (the default) is shaped after captured vLLM 0.32 bodies; llama-server's
chunks differ (a ``null`` first content, a separate finish chunk, ``timings``,
``system_fingerprint`` on every chunk); SGLang's and Ollama's ``/v1`` differ in
small ways. Every answer's ``usage`` carries ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
import random
import string
import zlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Choice", "SHAPES", "Shape", "sse", "dumps", "tool_call_delta"]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps(obj: Any) -> bytes:
    return _dumps(obj).encode()


def sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


@dataclass(slots=True)
class Answer:
    """What a response needs to know about one answered request."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    cached_tokens: int
    include_usage: bool = False
    completion_tokens: int = 0
    finish_reason: str = "stop"
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0


@dataclass(slots=True)
class Choice:
    """One choice of a whole answer: its text, or the tool calls it makes."""

    index: int
    text: str
    finish_reason: str
    tool_calls: list[dict[str, Any]] | None = None
    """OpenAI's ``message.tool_calls``: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``."""


def tool_call_delta(
    call_index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """A stream's ``delta`` for a tool call: the first names the call (id, name), the rest carry argument text."""
    call: dict[str, Any] = {"index": call_index}
    if call_id is not None:
        call.update(id=call_id, type="function", function={"name": name, "arguments": arguments})
    else:
        call["function"] = {"arguments": arguments}
    return {"tool_calls": [call]}


class Shape:
    """vLLM's shapes."""

    owned_by = "vllm"
    fingerprint: str | None = "vllm-0.32.0-opodsim"

    def new_id(self, kind: str, rng: random.Random) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{rng.getrandbits(64):016x}"

    def usage(self, a: Answer) -> dict[str, Any]:
        return {
            "prompt_tokens": a.prompt_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens,
            "completion_tokens": a.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
        }

    # -- whole answers -------------------------------------------------------------------------

    def chat(self, a: Answer, text: str) -> dict[str, Any]:
        return self.chat_choices(a, [Choice(0, text, a.finish_reason)])

    def completion(self, a: Answer, text: str) -> dict[str, Any]:
        return self.completion_choices(a, [Choice(0, text, a.finish_reason)])

    def chat_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        return {
            "id": a.id,
            "object": "chat.completion",
            "created": a.created,
            "model": a.model,
            "choices": [self._chat_choice(c) for c in choices],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": {**self.usage(a), "completion_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _chat_choice(self, c: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if c.tool_calls else c.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        message["reasoning"] = None
        return {
            "index": c.index,
            "message": message,
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }

    def completion_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        out = [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
            for c in choices
        ]
        return {
            "id": a.id,
            "object": "text_completion",
            "created": a.created,
            "model": a.model,
            "choices": out,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": self.usage(a),
            "kv_transfer_params": None,
        }

    # -- streams -------------------------------------------------------------------------------

    def _chunk(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": a.id, "object": obj, "created": a.created, "model": a.model, "choices": choices}

    def chat_start(self, a: Answer, index: int = 0) -> list[dict[str, Any]]:
        c = self._chunk(
            a,
            "chat.completion.chunk",
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
        )
        c["prompt_token_ids"] = None
        c["prompt_text"] = None
        return [c]

    def chat_token(self, a: Answer, piece: str, finish: str | None, index: int = 0) -> dict[str, Any]:
        return self.chat_delta(a, {"content": piece}, finish, index)

    def chat_delta(self, a: Answer, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        c = self._chunk(a, "chat.completion.chunk", [choice])
        if finish is not None and not a.include_usage:
            c["system_fingerprint"] = self.fingerprint
        return c

    def completion_start(self, a: Answer, index: int = 0) -> list[dict[str, Any]]:
        return []

    def completion_token(self, a: Answer, piece: str, finish: str | None, index: int = 0) -> dict[str, Any]:
        c = self._chunk(
            a,
            "text_completion",
            [{"index": index, "text": piece, "logprobs": None, "finish_reason": finish, "stop_reason": None}],
        )
        if finish is not None and not a.include_usage:
            c["system_fingerprint"] = self.fingerprint
        return c

    def stream_end(self, a: Answer, obj: str) -> list[dict[str, Any]]:
        if not a.include_usage:
            return []
        c = self._chunk(a, obj, [])
        c["usage"] = self.usage(a)
        c["system_fingerprint"] = self.fingerprint
        return [c]

    # -- models --------------------------------------------------------------------------------

    def model_card(self, name: str, created: int, max_model_len: int) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": self.owned_by,
            "root": name,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{zlib.crc32(name.encode()):016x}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    def models(self, names: tuple[str, ...], created: int, max_model_len: int, embedding_dim: int) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card(n, created, max_model_len) for n in names]}


class SGLangShape(Shape):
    owned_by = "sglang"
    fingerprint = None

    def model_card(self, name: str, created: int, max_model_len: int) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "sglang",
            "root": name,
            "max_model_len": max_model_len,
        }


class LlamaCppShape(Shape):
    owned_by = "llamacpp"
    fingerprint = "b1-opodsim"

    def new_id(self, kind: str, rng: random.Random) -> str:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + "".join(rng.choices(string.ascii_letters, k=32))

    def usage(self, a: Answer) -> dict[str, Any]:
        return {
            "completion_tokens": a.completion_tokens,
            "prompt_tokens": a.prompt_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
        }

    def timings(self, a: Answer) -> dict[str, Any]:
        prompt_n = a.prompt_tokens - a.cached_tokens
        pms, dms = max(a.prompt_ms, 1e-3), max(a.predicted_ms, 1e-3)
        return {
            "cache_n": a.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": a.prompt_ms,
            "prompt_per_token_ms": pms / max(prompt_n, 1),
            "prompt_per_second": prompt_n * 1000.0 / pms,
            "predicted_n": a.completion_tokens,
            "predicted_ms": a.predicted_ms,
            "predicted_per_token_ms": dms / max(a.completion_tokens, 1),
            "predicted_per_second": a.completion_tokens * 1000.0 / dms,
        }

    def _wrap(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "choices": choices,
            "created": a.created,
            "model": a.model,
            "system_fingerprint": self.fingerprint,
            "object": obj,
            "id": a.id,
        }

    def chat_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        out = []
        for c in choices:
            message: dict[str, Any] = {"role": "assistant", "content": None if c.tool_calls else c.text}
            if c.tool_calls:
                message["tool_calls"] = c.tool_calls
            out.append({"finish_reason": c.finish_reason, "index": c.index, "message": message})
        body = self._wrap(a, "chat.completion", out)
        body["usage"] = self.usage(a)
        body["timings"] = self.timings(a)
        return body

    def completion_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        body = self._wrap(
            a,
            "text_completion",
            [{"text": c.text, "index": c.index, "logprobs": None, "finish_reason": c.finish_reason} for c in choices],
        )
        body["usage"] = self.usage(a)
        body["timings"] = self.timings(a)
        return body

    def chat_start(self, a: Answer, index: int = 0) -> list[dict[str, Any]]:
        return [
            self._wrap(
                a,
                "chat.completion.chunk",
                [{"finish_reason": None, "index": index, "delta": {"role": "assistant", "content": None}}],
            )
        ]

    def chat_delta(self, a: Answer, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        return self._wrap(a, "chat.completion.chunk", [{"finish_reason": None, "index": index, "delta": delta}])

    def completion_token(self, a: Answer, piece: str, finish: str | None, index: int = 0) -> dict[str, Any]:
        return self._wrap(
            a, "text_completion", [{"text": piece, "index": index, "logprobs": None, "finish_reason": None}]
        )

    def stream_end(self, a: Answer, obj: str) -> list[dict[str, Any]]:
        chat = obj == "chat.completion.chunk"
        final = (
            {"finish_reason": a.finish_reason, "index": 0, "delta": {}}
            if chat
            else {"text": "", "index": 0, "logprobs": None, "finish_reason": a.finish_reason}
        )
        finish = self._wrap(a, obj, [final])
        if not a.include_usage:
            finish["timings"] = self.timings(a)
            return [finish]
        tail = self._wrap(a, obj, [])
        tail["usage"] = self.usage(a)
        tail["timings"] = self.timings(a)
        return [finish, tail]

    def models(self, names: tuple[str, ...], created: int, max_model_len: int, embedding_dim: int) -> dict[str, Any]:
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": [""],
            "parameter_size": "",
            "quantization_level": "",
        }
        return {
            "models": [
                {
                    "name": n,
                    "model": n,
                    "modified_at": "",
                    "size": "",
                    "digest": "",
                    "type": "model",
                    "description": "",
                    "tags": [""],
                    "capabilities": ["completion"],
                    "parameters": "",
                    "details": details,
                }
                for n in names
            ],
            "object": "list",
            "data": [
                {
                    "id": n,
                    "aliases": [n],
                    "tags": [],
                    "object": "model",
                    "created": created,
                    "owned_by": "llamacpp",
                    "meta": {
                        "vocab_type": 2,
                        "n_vocab": 32000,
                        "n_ctx": max_model_len,
                        "n_ctx_train": max_model_len,
                        "n_embd": embedding_dim,
                        "n_params": 0,
                        "size": 0,
                        "ftype": "sim",
                    },
                }
                for n in names
            ],
        }


class OllamaShape(Shape):
    owned_by = "library"
    fingerprint = "fp_ollama"

    def new_id(self, kind: str, rng: random.Random) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{rng.randint(0, 999)}"

    def usage(self, a: Answer) -> dict[str, Any]:
        return {
            "prompt_tokens": a.prompt_tokens,
            "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
        }

    def _wrap(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": a.id,
            "object": obj,
            "created": a.created,
            "model": a.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }

    def chat_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        out = []
        for c in choices:
            message: dict[str, Any] = {"role": "assistant", "content": "" if c.tool_calls else c.text}
            if c.tool_calls:
                message["tool_calls"] = c.tool_calls
            out.append({"index": c.index, "message": message, "finish_reason": c.finish_reason})
        body = self._wrap(a, "chat.completion", out)
        body["usage"] = self.usage(a)
        return body

    def completion_choices(self, a: Answer, choices: list[Choice]) -> dict[str, Any]:
        body = self._wrap(
            a,
            "text_completion",
            [{"text": c.text, "index": c.index, "finish_reason": c.finish_reason} for c in choices],
        )
        body["usage"] = self.usage(a)
        return body

    def chat_start(self, a: Answer, index: int = 0) -> list[dict[str, Any]]:
        return []

    def chat_delta(self, a: Answer, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        return self._wrap(
            a,
            "chat.completion.chunk",
            [{"index": index, "delta": {"role": "assistant", "content": "", **delta}, "finish_reason": None}],
        )

    def completion_token(self, a: Answer, piece: str, finish: str | None, index: int = 0) -> dict[str, Any]:
        return self._wrap(a, "text_completion", [{"text": piece, "index": index, "finish_reason": None}])

    def stream_end(self, a: Answer, obj: str) -> list[dict[str, Any]]:
        if obj == "chat.completion.chunk":
            final = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": a.finish_reason}
        else:
            final = {"text": "", "index": 0, "finish_reason": a.finish_reason}
        out = [self._wrap(a, obj, [final])]
        if a.include_usage:
            tail = self._wrap(a, obj, [])
            tail["usage"] = self.usage(a)
            out.append(tail)
        return out

    def models(self, names: tuple[str, ...], created: int, max_model_len: int, embedding_dim: int) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "library"} for n in names],
        }


SHAPES: dict[str, type[Shape]] = {
    "vllm": Shape,
    "sglang": SGLangShape,
    "llamacpp": LlamaCppShape,
    "ollama": OllamaShape,
}
