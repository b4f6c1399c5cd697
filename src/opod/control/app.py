"""The admin listener's app: ``/api/v1`` behind the admin key, with the listener's own refusals.

Before the key is looked at, the listener refuses a ``Host`` that is a name
rather than an address or ``localhost`` (a DNS-rebinding page), a request
another site's page sent (``Sec-Fetch-Site`` other than same-origin or none, an
``Origin`` other than the listener's own), and any method but GET and HEAD whose
``Content-Type`` is not JSON, a missing one included (a cross-site form). Every
path under ``/api``, ``openapi.json`` included, needs the admin key. Every
refusal and every error, an unknown path, a wrong method or a failure included,
is an ``ErrorView``: ``{"error": "..."}``. ``X-Llmgw-Actor`` names who made a
change: letters, digits and ``._-@``, at most 64; ``unknown`` when absent.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from opod import __version__
from opod.control import audit as audit_area
from opod.control import capacity as capacity_area
from opod.control import client_jobs as client_jobs_area
from opod.control import keys, models, nodes
from opod.control import metrics as metrics_area
from opod.control import notify as notify_area
from opod.control import people as people_area
from opod.control import presets as presets_area
from opod.control import quotas as quotas_area
from opod.control import replicas as replicas_area
from opod.control import requests as requests_area
from opod.control import settings as settings_area
from opod.control import tenancy as tenancy_area
from opod.control import usage as usage_area
from opod.control import weights as weights_area
from opod.control.audit import open_draft, record_after
from opod.control.context import ControlContext, ControlError
from opod.control.spec import SpecRouter, document
from opod.control.unbuilt import hardware, rollouts, services, signin
from opod.http.errors import BadRequest, Unauthorized
from opod.http.inbound import json_value
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError

log = logging.getLogger("opod.control")

ACTOR = re.compile(r"[A-Za-z0-9._@-]{1,64}")
"""``X-Llmgw-Actor``: who a change is recorded as made by."""
MAX_BODY = 8 * 1024 * 1024
"""The largest body a management API call may send."""


def refusal(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The spec's ``ErrorView``: every refusal and error of the admin listener."""
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers) if headers else None)


def _cross_site(request: Request) -> str:
    """Why the request looks sent by another site's page, or ``""``."""
    fetch_site = request.headers.get("sec-fetch-site", "")
    if fetch_site and fetch_site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {fetch_site}"
    origin = request.headers.get("origin")
    if origin is not None:
        where = urlsplit(origin)
        if origin == "null" or where.netloc != request.headers.get("host", ""):
            return f"Origin: {origin}"
    return ""


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
    app = FastAPI(title="opod management API", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if not _host_ok(request.headers.get("host", "")):
            return refusal(403, "the admin listener answers only requests addressed to an IP address or localhost")
        if why := _cross_site(request):
            return refusal(
                403,
                f"the admin listener refuses requests another site's page sent ({why}); call it from a script or opod ctl",
            )
        if request.method not in ("GET", "HEAD") and not request.headers.get("content-type", "").startswith(
            "application/json"
        ):
            return refusal(415, f"{request.method} needs Content-Type: application/json (even without a body)")
        actor = request.headers.get("x-llmgw-actor")
        if actor is not None and not ACTOR.fullmatch(actor):
            return refusal(
                400, "X-Llmgw-Actor: letters, digits and ._-@ only, at most 64 (who the change is recorded as made by)"
            )
        if request.url.path.startswith("/api/"):
            try:
                ctx.access.keys.check(request.headers.get("authorization"), kinds=("admin",))
            except Unauthorized as err:
                return refusal(401, err.message)
        if request.method in ("GET", "HEAD"):
            return await answer(request, call_next)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            return refusal(
                413,
                f"the body is {int(declared)} bytes; the management API takes at most {MAX_BODY} (split the change)",
            )
        body = await request.body()
        try:
            if body.strip():  # a client's JSON rules (nesting, encodable text), before the draft's parse and FastAPI's
                json_value(body)
        except BadRequest as err:
            return refusal(400, err.message)
        draft = open_draft(request, actor or "unknown", body)
        response = await answer(request, call_next)
        ctx.emit(
            "admin.call",
            request.url.path,
            {"method": request.method, "status": response.status_code, "actor": draft.actor},
        )
        await record_after(ctx.store, request, draft, response.status_code)
        return response

    async def answer(request: Request, call_next) -> Response:
        try:
            return await call_next(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return refusal(500, f"{request.method} {request.url.path} failed on the leader; its log says why")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        if err.status_code == 404:
            return refusal(
                404, f"no such path: {request.method} {request.url.path} (GET /api/v1/openapi.json lists them)"
            )
        if err.status_code == 405:
            allowed = (err.headers or {}).get("Allow", "")
            return refusal(
                405,
                f"{request.url.path} does not answer {request.method}" + (f"; it answers {allowed}" if allowed else ""),
                headers=err.headers,
            )
        return refusal(err.status_code, str(err.detail), headers=err.headers)

    @app.exception_handler(ControlError)
    async def control_error(request: Request, err: ControlError) -> JSONResponse:
        return refusal(err.status, err.message)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, err: StoreError) -> JSONResponse:
        if isinstance(err, (NotFound, Conflict, InvalidInput)):
            status = 404 if isinstance(err, NotFound) else 409 if isinstance(err, Conflict) else 400
            return refusal(status, str(err))
        return refusal(503, f"the store failed: {err}; retry shortly", headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        parts = []
        for e in err.errors():
            where = (
                ".".join(str(p) for p in e["loc"][1:])
                if e["loc"][:1] == ("body",)
                else ".".join(str(p) for p in e["loc"])
            )
            if e["loc"] == ("body",):
                where = "body"
                e = {
                    **e,
                    "msg": "send a JSON object"
                    if e["type"] in ("missing", "model_attributes_type", "dict_type")
                    else e["msg"],
                }
            parts.append(f"{where or 'body'}: {e['msg']}")
        return refusal(400, "; ".join(parts))

    for area in (keys.router(ctx), models.router(ctx), nodes.router(ctx)):
        app.include_router(area)
    app.include_router(weights_area.router(ctx))
    app.include_router(presets_area.router(ctx))
    app.include_router(replicas_area.router(ctx))
    app.include_router(capacity_area.router(ctx))
    app.include_router(quotas_area.router(ctx))
    app.include_router(client_jobs_area.router(ctx))
    app.include_router(audit_area.router(ctx.store))
    app.include_router(settings_area.router(ctx))
    app.include_router(notify_area.router(ctx))
    app.include_router(metrics_area.router(ctx))
    app.include_router(people_area.router(ctx))
    app.include_router(tenancy_area.router(ctx))
    app.include_router(usage_area.router(ctx))
    app.include_router(requests_area.router(ctx))
    for unbuilt in (signin, rollouts, services, hardware):
        app.include_router(unbuilt.router())

    own = SpecRouter()
    cached: dict[str, Any] = {}

    @own.get("/api/v1/openapi.json", operation_id="getOpenapiJson", tags=["openapi"], response_model=dict[str, Any])
    async def get_openapi_json() -> dict[str, Any]:
        if not cached:
            cached.update(document(app))
        return cached

    app.include_router(own)
    return app
