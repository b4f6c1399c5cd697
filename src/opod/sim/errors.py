"""Error bodies in each engine's own shape.

* ``openai`` (vLLM, SGLang, Ollama's ``/v1``): ``{"error":{"message","type","param","code"}}``
  with ``code`` the HTTP status, as vLLM writes it;
* ``llamacpp``: ``{"error":{"code","message","type"}}`` with llama-server's type names;
* ``ollama`` (its native ``/api``): ``{"error":"…"}``.

An unknown model is answered 404 with ``code: "model_not_found"`` in every shape
that has a code, so one client check works against any dialect.
"""

from __future__ import annotations

import json

from starlette.responses import Response

__all__ = ["SimHTTPError", "error_response", "bad_request", "model_not_found"]

_OPENAI_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}
_LLAMA_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class SimHTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        """An explicit error type; otherwise the flavour's name for the status."""


def bad_request(param: str, message: str) -> SimHTTPError:
    return SimHTTPError(400, message, param=param)


def model_not_found(model: str, served: tuple[str, ...]) -> SimHTTPError:
    return SimHTTPError(
        404,
        f"The model `{model}` does not exist. Valid names: {', '.join(served)}.",
        param="model",
        code="model_not_found",
    )


def error_body(flavor: str, err: SimHTTPError) -> dict[str, object]:
    if flavor == "ollama":
        return {"error": err.message}
    if flavor == "llamacpp":
        kind = err.kind or _LLAMA_TYPES.get(err.status, "server_error")
        return {
            "error": {"code": err.code if err.code is not None else err.status, "message": err.message, "type": kind}
        }
    kind = err.kind or _OPENAI_TYPES.get(err.status, "InternalServerError")
    return {
        "error": {
            "message": err.message,
            "type": kind,
            "param": err.param,
            "code": err.code if err.code is not None else err.status,
        }
    }


def error_response(flavor: str, err: SimHTTPError) -> Response:
    return Response(json.dumps(error_body(flavor, err)), status_code=err.status, media_type="application/json")
