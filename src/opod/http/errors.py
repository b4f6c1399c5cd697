"""Typed refusals shared by the listeners, each with an honest status, and OpenAI's error body that `/v1` and the door answer with."""

from __future__ import annotations

import json

from starlette.responses import Response


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        error = {"message": self.message, "type": self.type, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str, known: list[str]) -> None:
        hint = f" Models served here: {', '.join(known)}." if known else " No model is served yet: add one with `opod model add`."
        super().__init__(f"The model {model!r} does not exist here.{hint}", param="model")


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than this route accepts ({limit // (1 << 20)} MiB); send less.")


class NotSupported(GatewayError):
    status = 501
    type = "invalid_request_error"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class NoCapacity(GatewayError):
    """Nothing can serve the request now: 503 with Retry-After, never a 502."""

    status = 503
    type = "service_unavailable"
    code = "no_capacity"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


def error_response(error: GatewayError, request_id: str) -> Response:
    headers = {"X-Request-Id": request_id, **error.headers}
    return Response(json.dumps(error.body()), status_code=error.status, media_type="application/json", headers=headers)
