"""An engine's refusal of a request's content, and the client's 400 made from it.

Engines word their errors each in their own envelope: llama-server
``{"error":{"code":400,"message","type"}}`` (with extras such as ``n_ctx``), vLLM and
SGLang OpenAI's ``{"error":{"message","type","param","code"}}``, Ollama ``{"error":"…"}``,
a FastAPI server ``{"detail":…}``. The client always gets OpenAI's shape, with the
engine's own words, so it learns what to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opod.fleet.state import NodeState

MESSAGE_CAP = 1000
"""An engine may echo a whole prompt into its message; the client gets this many characters of it."""

_CODES = {"exceed_context_size_error": ("context_length_exceeded", "messages")}
"""Engine error types that OpenAI names otherwise: (code, param)."""
_GENERIC = frozenset(
    {
        "server_error",
        "invalid_request_error",
        "BadRequestError",
        "InternalServerError",
        "NotImplementedError",
        "not_supported_error",
        "NotFoundError",
        "not_found_error",
    }
)


@dataclass(slots=True)
class Refusal:
    """One engine's error answer to a request, and where and when it came."""

    node: NodeState
    status: int
    message: str
    code: str
    param: str | None
    final: bool
    """A 4xx: the engine refused the content; otherwise a 5xx that may be the engine's own."""
    route: str
    sent: float
    answered: float

    @classmethod
    def of(
        cls, node: NodeState, status: int, data: bytes, *, final: bool, route: str, sent: float, answered: float
    ) -> Refusal:
        message, code, param = engine_error(data)
        return cls(
            node, status, message or f"HTTP {status} with no explanation", code, param, final, route, sent, answered
        )


def engine_error(data: bytes) -> tuple[str, str, str | None]:
    """(message, code, param) from an engine's error body, whatever its envelope."""
    text = data.decode(errors="replace").strip()
    try:
        body = json.loads(text) if text else None
    except ValueError:
        return text[:MESSAGE_CAP], "invalid_request", None
    error = body.get("error", body.get("detail", body)) if isinstance(body, dict) else body
    if isinstance(error, str):
        return error[:MESSAGE_CAP], "invalid_request", None
    if not isinstance(error, dict):
        return (json.dumps(error) if error is not None else "")[:MESSAGE_CAP], "invalid_request", None
    message = str(error.get("message") or error.get("msg") or error.get("detail") or "")[:MESSAGE_CAP]
    kind, code, param = error.get("type"), error.get("code"), error.get("param")
    if isinstance(kind, str) and kind in _CODES:
        mapped, mapped_param = _CODES[kind]
        return message, mapped, param if isinstance(param, str) else mapped_param
    if isinstance(code, str) and code:
        named = code
    elif isinstance(kind, str) and kind and kind not in _GENERIC:
        named = kind
    else:
        named = "invalid_request"
    return message, named, param if isinstance(param, str) and param else None


def refusal_body(refusal: Refusal) -> dict[str, dict[str, str | None]]:
    """The client's 400 body: OpenAI's error shape, the engine's words, and that sending it again will not help."""
    error: dict[str, str | None] = {
        "message": f"The model's engine refused this request (HTTP {refusal.status}): {refusal.message}",
        "type": "invalid_request_error",
        "code": refusal.code,
    }
    error["param"] = refusal.param
    return {"error": error}
