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

__all__ = ["Answer", "SHAPES", "Shape", "sse", "dumps"]

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
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None, "function_call": None, "reasoning": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": a.finish_reason, "stop_reason": None, "token_ids": None, "routed_experts": None}
        return {
            "id": a.id, "object": "chat.completion", "created": a.created, "model": a.model, "choices": [choice],
            "service_tier": None, "system_fingerprint": self.fingerprint, "usage": {**self.usage(a), "completion_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        }

    def completion(self, a: Answer, text: str) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": a.finish_reason, "stop_reason": None, "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None}
        return {
            "id": a.id, "object": "text_completion", "created": a.created, "model": a.model, "choices": [choice],
            "service_tier": None, "system_fingerprint": self.fingerprint, "usage": self.usage(a), "kv_transfer_params": None,
        }

    # -- streams -------------------------------------------------------------------------------

    def _chunk(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": a.id, "object": obj, "created": a.created, "model": a.model, "choices": choices}

    def chat_start(self, a: Answer) -> list[dict[str, Any]]:
        c = self._chunk(a, "chat.completion.chunk", [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        c["prompt_token_ids"] = None
        c["prompt_text"] = None
        return [c]

    def chat_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        c = self._chunk(a, "chat.completion.chunk", [choice])
        if finish is not None and not a.include_usage:
            c["system_fingerprint"] = self.fingerprint
        return c

    def completion_start(self, a: Answer) -> list[dict[str, Any]]:
        return []

    def completion_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        c = self._chunk(a, "text_completion", [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish, "stop_reason": None}])
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
            "id": name, "object": "model", "created": created, "owned_by": self.owned_by, "root": name, "parent": None,
            "max_model_len": max_model_len,
            "permission": [{
                "id": f"modelperm-{zlib.crc32(name.encode()):016x}", "object": "model_permission", "created": created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
            }],
        }

    def models(self, names: tuple[str, ...], created: int, max_model_len: int, embedding_dim: int) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card(n, created, max_model_len) for n in names]}


class SGLangShape(Shape):
    owned_by = "sglang"
    fingerprint = None

    def model_card(self, name: str, created: int, max_model_len: int) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "sglang", "root": name, "max_model_len": max_model_len}


class LlamaCppShape(Shape):
    owned_by = "llamacpp"
    fingerprint = "b1-opodsim"

    def new_id(self, kind: str, rng: random.Random) -> str:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + "".join(rng.choices(string.ascii_letters, k=32))

    def usage(self, a: Answer) -> dict[str, Any]:
        return {
            "completion_tokens": a.completion_tokens, "prompt_tokens": a.prompt_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens, "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
        }

    def timings(self, a: Answer) -> dict[str, Any]:
        prompt_n = a.prompt_tokens - a.cached_tokens
        pms, dms = max(a.prompt_ms, 1e-3), max(a.predicted_ms, 1e-3)
        return {
            "cache_n": a.cached_tokens, "prompt_n": prompt_n, "prompt_ms": a.prompt_ms,
            "prompt_per_token_ms": pms / max(prompt_n, 1), "prompt_per_second": prompt_n * 1000.0 / pms,
            "predicted_n": a.completion_tokens, "predicted_ms": a.predicted_ms,
            "predicted_per_token_ms": dms / max(a.completion_tokens, 1), "predicted_per_second": a.completion_tokens * 1000.0 / dms,
        }

    def _wrap(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"choices": choices, "created": a.created, "model": a.model, "system_fingerprint": self.fingerprint, "object": obj, "id": a.id}

    def chat(self, a: Answer, text: str) -> dict[str, Any]:
        body = self._wrap(a, "chat.completion", [{"finish_reason": a.finish_reason, "index": 0, "message": {"role": "assistant", "content": text}}])
        body["usage"] = self.usage(a)
        body["timings"] = self.timings(a)
        return body

    def completion(self, a: Answer, text: str) -> dict[str, Any]:
        body = self._wrap(a, "text_completion", [{"text": text, "index": 0, "logprobs": None, "finish_reason": a.finish_reason}])
        body["usage"] = self.usage(a)
        body["timings"] = self.timings(a)
        return body

    def chat_start(self, a: Answer) -> list[dict[str, Any]]:
        return [self._wrap(a, "chat.completion.chunk", [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}])]

    def chat_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        return self._wrap(a, "chat.completion.chunk", [{"finish_reason": None, "index": 0, "delta": {"content": piece}}])

    def completion_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        return self._wrap(a, "text_completion", [{"text": piece, "index": 0, "logprobs": None, "finish_reason": None}])

    def stream_end(self, a: Answer, obj: str) -> list[dict[str, Any]]:
        chat = obj == "chat.completion.chunk"
        final = {"finish_reason": a.finish_reason, "index": 0, "delta": {}} if chat else {"text": "", "index": 0, "logprobs": None, "finish_reason": a.finish_reason}
        finish = self._wrap(a, obj, [final])
        if not a.include_usage:
            finish["timings"] = self.timings(a)
            return [finish]
        tail = self._wrap(a, obj, [])
        tail["usage"] = self.usage(a)
        tail["timings"] = self.timings(a)
        return [finish, tail]

    def models(self, names: tuple[str, ...], created: int, max_model_len: int, embedding_dim: int) -> dict[str, Any]:
        details = {"parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "", "quantization_level": ""}
        return {
            "models": [
                {"name": n, "model": n, "modified_at": "", "size": "", "digest": "", "type": "model", "description": "", "tags": [""],
                 "capabilities": ["completion"], "parameters": "", "details": details}
                for n in names
            ],
            "object": "list",
            "data": [
                {"id": n, "aliases": [n], "tags": [], "object": "model", "created": created, "owned_by": "llamacpp",
                 "meta": {"vocab_type": 2, "n_vocab": 32000, "n_ctx": max_model_len, "n_ctx_train": max_model_len, "n_embd": embedding_dim,
                          "n_params": 0, "size": 0, "ftype": "sim"}}
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
            "prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens, "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
        }

    def _wrap(self, a: Answer, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": a.id, "object": obj, "created": a.created, "model": a.model, "system_fingerprint": self.fingerprint, "choices": choices}

    def chat(self, a: Answer, text: str) -> dict[str, Any]:
        body = self._wrap(a, "chat.completion", [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": a.finish_reason}])
        body["usage"] = self.usage(a)
        return body

    def completion(self, a: Answer, text: str) -> dict[str, Any]:
        body = self._wrap(a, "text_completion", [{"text": text, "index": 0, "finish_reason": a.finish_reason}])
        body["usage"] = self.usage(a)
        return body

    def chat_start(self, a: Answer) -> list[dict[str, Any]]:
        return []

    def chat_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        return self._wrap(a, "chat.completion.chunk", [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}])

    def completion_token(self, a: Answer, piece: str, finish: str | None) -> dict[str, Any]:
        return self._wrap(a, "text_completion", [{"text": piece, "index": 0, "finish_reason": None}])

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
        return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "library"} for n in names]}


SHAPES: dict[str, type[Shape]] = {"vllm": Shape, "sglang": SGLangShape, "llamacpp": LlamaCppShape, "ollama": OllamaShape}
