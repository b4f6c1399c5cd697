"""Typed refusals shared by the listeners, each with an honest status, and OpenAI's error body that `/v1` and the door answer with."""

from __future__ import annotations

import json

from starlette.responses import Response

SHOWN = 64
"""The most characters of a client's value a refusal repeats: enough to recognise it, never the whole of it."""


def shown(value: object, limit: int = SHOWN) -> str:
    """``repr(value)`` for a refusal that names what a client sent, cut to ``limit`` characters."""
    return cut(repr(value), limit)


def cut(text: str, limit: int = SHOWN) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error object: every key always present, ``param`` null when no one field is at fault."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextLengthExceeded(BadRequest):
    """The request cannot fit the model's context; OpenAI's code, so clients that trim and retry recognise it."""

    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str, known: list[str]) -> None:
        hint = (
            f" Models served here: {', '.join(known)}."
            if known
            else " No model is served yet: add one with `opod model add`."
        )
        super().__init__(f"The model {shown(model)} does not exist here.{hint}", param="model")


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than this route accepts ({limit // (1 << 20)} MiB); send less.")


class NotSupported(GatewayError):
    """The model does not do what the route asks (chat on an embedding model): the request's fault, so a 400
    that clients do not retry, never a 5xx."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, param="model")
        self.code = code


class UnknownRoute(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"

    def __init__(self, method: str, path: str, routes: list[str]) -> None:
        super().__init__(f"Invalid URL ({method} {cut(path)}): no such route. The routes here: {', '.join(routes)}.")


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, method: str, path: str, allowed: list[str]) -> None:
        super().__init__(
            f"{path} does not answer {method}; use {' or '.join(allowed)}.", headers={"Allow": ", ".join(allowed)}
        )


class NoCapacity(GatewayError):
    """Nothing can serve the request now: 503 with Retry-After, never a 502."""

    status = 503
    type = "service_unavailable"
    code = "no_capacity"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class LoopDetected(GatewayError):
    """A request came back to a cluster it already passed through (federation peers that fall back to each other):
    508, so it is not sent round again."""

    status = 508
    type = "invalid_request_error"
    code = "loop_detected"

    def __init__(self, cluster: str, hops: str) -> None:
        super().__init__(
            f"This request already passed through this cluster ({cluster}; its hops: {cut(hops, 200)}): federation "
            "peers send it to each other. Change the models' fallbacks so they do not lead back here."
        )


def error_response(error: GatewayError, request_id: str) -> Response:
    headers = {"X-Request-Id": request_id, **error.headers}
    return Response(json.dumps(error.body()), status_code=error.status, media_type="application/json", headers=headers)
