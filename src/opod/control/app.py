"""The admin listener's app: ``/api/v1`` behind the admin key, with the listener's own refusals.

Before the key is looked at, the listener refuses a ``Host`` that is a name
rather than an address or ``localhost`` (a DNS-rebinding page), and any method
but GET and HEAD whose ``Content-Type`` is not JSON (a cross-site form).
Every refusal is ``{"error": "..."}``.
"""

from __future__ import annotations

import ipaddress

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from opod import __version__
from opod.control import keys, models, nodes
from opod.control.context import ControlContext, ControlError
from opod.http.errors import Unauthorized
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError


def _host_ok(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    if name in ("localhost", ""):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def create_app(ctx: ControlContext) -> FastAPI:
    app = FastAPI(title="opod management API", version=__version__, docs_url=None, redoc_url=None, openapi_url="/api/v1/openapi.json")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if not _host_ok(request.headers.get("host", "")):
            return JSONResponse({"error": "the admin listener answers only requests addressed to an IP address or localhost"}, status_code=403)
        if request.method not in ("GET", "HEAD") and not request.headers.get("content-type", "application/json").startswith("application/json"):
            return JSONResponse({"error": "send a JSON body with Content-Type: application/json"}, status_code=415)
        if request.url.path.startswith("/api/") and request.url.path != "/api/v1/openapi.json":
            try:
                ctx.access.keys.check(request.headers.get("authorization"), kinds=("admin",))
            except Unauthorized as err:
                return JSONResponse({"error": err.message}, status_code=401)
        response = await call_next(request)
        if request.method not in ("GET", "HEAD"):
            actor = request.headers.get("x-llmgw-actor", "") or "unknown"
            ctx.emit("admin.call", request.url.path, {"method": request.method, "status": response.status_code, "actor": actor[:64]})
        return response

    @app.exception_handler(ControlError)
    async def control_error(request: Request, err: ControlError) -> JSONResponse:
        return JSONResponse({"error": err.message}, status_code=err.status)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, err: StoreError) -> JSONResponse:
        if isinstance(err, (NotFound, Conflict, InvalidInput)):
            status = 404 if isinstance(err, NotFound) else 409 if isinstance(err, Conflict) else 400
            return JSONResponse({"error": str(err)}, status_code=status)
        return JSONResponse({"error": f"the store failed: {err}; retry shortly"}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in err.errors()]
        return JSONResponse({"error": "; ".join(parts)}, status_code=400)

    app.include_router(keys.router(ctx))
    app.include_router(models.router(ctx))
    app.include_router(nodes.router(ctx))
    return app
