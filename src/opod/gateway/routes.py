"""The ``/v1`` routes the gateway serves: each path's capability, body cap and request rules, and what a route
changes in a request before any engine sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opod.gateway.responses import check_translated
from opod.gateway.validate import Check, check_chat, check_completion, check_embeddings, check_rerank, no_check

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class RouteSpec:
    path: str
    capability: str
    body_cap: int
    check: Check = no_check
    """The route's request rules, run before admission."""


ROUTES = (
    RouteSpec("/v1/chat/completions", "chat", 32 * MiB, check_chat),
    RouteSpec("/v1/completions", "chat", 32 * MiB, check_completion),
    RouteSpec("/v1/embeddings", "embedding", 8 * MiB, check_embeddings),
    RouteSpec("/v1/rerank", "rerank", 8 * MiB, check_rerank),
)

TRANSLATED_RESPONSES = RouteSpec("/v1/chat/completions", "chat", 32 * MiB, check_translated)
"""A Responses request, translated onto chat completions: the chat route's rules, in the Responses API's names."""

UNSUPPORTED = {
    # a capability → (the error code, what a model without it is said to lack)
    "embedding": (
        "embeddings_not_supported",
        "does not produce embeddings; use an embedding model such as all-minilm-l6-v2",
    ),
    "rerank": ("rerank_not_supported", "cannot rerank; use a reranker such as bge-reranker-v2-m3-gguf"),
    "chat": ("chat_not_supported", "does not generate text; use a chat model"),
}


ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""What the ``/v1`` fallback answers (Starlette gives a route without methods GET alone)."""


JSON_OBJECT_SCHEMA = {"type": "object"}


def json_object_as_schema(payload: dict[str, Any]) -> bool:
    """Give ``response_format: {"type": "json_object"}`` the schema it stands for; True when the payload changed.

    OpenAI's ``json_object`` promises an answer that is one JSON object. llama.cpp's server builds
    its grammar from a schema and, given none, constrains nothing; ``{"type": "object"}`` is exactly
    the promise, and engines that build ``json_object``'s grammar themselves ignore the key.
    """
    if "response_format" not in payload:  # most requests name none
        return False
    response_format = payload["response_format"]
    if (
        not isinstance(response_format, dict)
        or response_format.get("type") != "json_object"
        or response_format.get("schema")
    ):
        return False
    payload["response_format"] = {**response_format, "schema": JSON_OBJECT_SCHEMA}
    return True
