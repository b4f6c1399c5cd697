"""The door's proxy: ``/v1`` requests go to the leader their ``model`` names; answers come back byte for byte.

- ``GET /v1/models`` lists the aliases of the routes file; ``GET /v1/models/{alias}`` one of them.
- ``POST /v1/...``: the body's ``model`` picks the route. When the route names
  an upstream model, that field is rewritten (and only then is the body
  re-encoded); when it names a key, the door presents it instead of the client's.
- An unknown model is 404 ``model_not_found``. A leader that cannot be reached
  (or that drops the connection before answering), or that answers 503, hands
  the request to the alias's next leader; when none is left the answer is 503
  with ``Retry-After``, never 502. Any other answer, status included, is passed on.
- Every answer carries ``X-Request-Id`` (the client's, or a new one), which is
  also sent to the leader.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from opod.door.routes import DoorRoutesFile, Target
from opod.http.errors import (
    BadRequest,
    GatewayError,
    ModelNotFound,
    NoCapacity,
    error_response,
)
from opod.http.inbound import json_object, read_body, request_id_for

MiB = 1 << 20
BODY_CAP = 32 * MiB
CONNECT_TIMEOUT_S = 3.0
RETRY_AFTER_S = 5

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never forwarded.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_UPSTREAM = _HOP | {"host", "content-length", "x-request-id"}
_NOT_DOWNSTREAM = _HOP | {"x-request-id"}


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Door:
    """The proxy's handlers over a routes holder; :meth:`app` is the ASGI app, :meth:`close` at shutdown."""

    def __init__(self, routes: DoorRoutesFile) -> None:
        self.routes = routes
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Bytes pass through as the leader sent them: no decompression, no timeout on long streams.
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=None),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> RequestIds:
        return RequestIds(
            Starlette(
                exception_handlers={404: self._http_error, 405: self._http_error},
                routes=[
                    Route("/healthz", self.healthz, methods=["GET"]),
                    Route("/readyz", self.readyz, methods=["GET"]),
                    Route("/v1/models", self.list_models, methods=["GET"]),
                    Route("/v1/models/{alias:path}", self.get_model, methods=["GET"]),
                    Route("/v1/{rest:path}", self.proxy, methods=["POST"]),
                    Route("/v1/{rest:path}", self.not_found, methods=["GET", "PUT", "PATCH", "DELETE"]),
                ],
            )
        )

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        return await self.not_found(request)

    # --- small routes ------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(self, request: Request) -> Response:
        table = self.routes.table()
        if table is None:
            return JSONResponse(
                {"ready": False, "reason": "no routes file applied yet"},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return JSONResponse({"ready": True, "revision": table.revision, "models": table.aliases()})

    def _aliases(self) -> list[str]:
        table = self.routes.table()
        return table.aliases() if table is not None else []

    async def list_models(self, request: Request) -> Response:
        request_id = request_id_for(request)
        now = int(time.time())
        data = [{"id": alias, "object": "model", "created": now, "owned_by": "opod"} for alias in self._aliases()]
        return JSONResponse({"object": "list", "data": data}, headers={"X-Request-Id": request_id})

    async def get_model(self, request: Request) -> Response:
        request_id = request_id_for(request)
        alias = request.path_params["alias"]
        if not self.routes.lookup(alias):
            return error_response(ModelNotFound(alias, self._aliases()), request_id)
        return JSONResponse(
            {"id": alias, "object": "model", "created": int(time.time()), "owned_by": "opod"},
            headers={"X-Request-Id": request_id},
        )

    async def not_found(self, request: Request) -> Response:
        return error_response(
            NotFound(f"{request.method} {request.url.path} is not served by this door."), request_id_for(request)
        )

    # --- the proxy ----------------------------------------------------------------------

    async def proxy(self, request: Request) -> Response:
        request_id = request_id_for(request)
        try:
            return await self._proxy(request, request_id)
        except GatewayError as err:
            return error_response(err, request_id)

    async def _proxy(self, request: Request, request_id: str) -> Response:
        body = await read_body(request, BODY_CAP)
        payload = json_object(body)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model must name a model (GET /v1/models lists those behind this door).", param="model")
        targets = self.routes.lookup(model)
        if not targets:
            raise ModelNotFound(model, self._aliases())
        refusal: NoCapacity | None = None
        for i, target in enumerate(targets):
            sent = json.dumps({**payload, "model": target.model}).encode() if target.rewrites_model else body
            try:
                resp = await self._send(request, target, sent, request_id)
            except NoCapacity as err:
                refusal = err
                continue
            if resp.status == 503 and i + 1 < len(targets):
                resp.release()  # this leader has nothing to serve with now; the next one may
                continue
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _NOT_DOWNSTREAM}
            out["X-Request-Id"] = request_id
            return StreamingResponse(self._relay(resp, target), status_code=resp.status, headers=out)
        assert refusal is not None
        raise refusal

    async def _send(self, request: Request, target: Target, body: bytes, request_id: str) -> aiohttp.ClientResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_UPSTREAM}
        if target.key:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {target.key}"
        headers["X-Request-Id"] = request_id
        url = target.base + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            return await self.session.request("POST", url, data=body, headers=headers, allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise NoCapacity(
                f"The leader serving {target.alias!r} ({target.base}) cannot be reached: {err or type(err).__name__}. Retry shortly.",
                retry_after=RETRY_AFTER_S,
            ) from None

    async def _relay(self, resp: aiohttp.ClientResponse, target: Target) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            if resp.content_type == "text/event-stream":
                yield _cut_off_event(target, err)
        finally:
            resp.release()


class RequestIds:
    """Gives every answer an ``X-Request-Id``, including those no handler of the door wrote."""

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", request_id_for(Request(scope)).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


def _cut_off_event(target: Target, err: BaseException) -> bytes:
    error = {
        "message": f"The answer was cut off: the leader serving {target.alias!r} ({target.base}) stopped mid-stream "
        f"({type(err).__name__}). Retry the request.",
        "type": "server_error",
        "code": "upstream_interrupted",
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
