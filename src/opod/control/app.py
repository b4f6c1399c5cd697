"""The admin listener's app: ``/api/v1`` from the list of areas, behind the listener's checks.

:mod:`opod.control.listener` checks every call before a route sees it; here every error a route
raises becomes the spec's ``ErrorView`` (``{"error": "..."}``) with its status: an unknown path,
a wrong method, a body that does not parse, the typed errors of the services and the store.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from opod import __version__
from opod.control import unbuilt
from opod.control.areas import admin_areas, admin_pages
from opod.control.console.auth import PageAuth
from opod.control.console.site import console_routes
from opod.control.context import ControlContext, ControlError
from opod.control.listener import AdminGuard, refusal
from opod.control.permits import SessionGate
from opod.control.spec import SpecRouter, document
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError

log = logging.getLogger("opod.control")

_REFUSALS: dict[type[StoreError], int] = {InvalidInput: 400, Forbidden: 403, NotFound: 404, Conflict: 409}
"""The services' typed refusals and the status each answers; any other store error is the store failing (503)."""


def create_app(ctx: ControlContext, pages: PageAuth) -> FastAPI:
    """``pages``: who is signed in to the console (under ``/console``), what they may do, their CSRF token."""
    app = FastAPI(title="opod management API", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    gate = SessionGate(ctx.signin.sessions, ctx.permissions, ctx.tenancy, ctx.access, ctx.settings_service)
    app.add_middleware(AdminGuard, keys=ctx.access.keys, store=ctx.store, events=ctx.events, sessions=gate)

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
        status = next((s for kind, s in _REFUSALS.items() if isinstance(err, kind)), None)
        if status is not None:
            return refusal(status, str(err))
        return refusal(503, f"the store failed: {err}; retry shortly", headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        parts = []
        for e in err.errors():
            loc = tuple(e["loc"])
            if loc == ("body",):
                body_type = e["type"] in ("missing", "model_type", "model_attributes_type", "dict_type")
                parts.append(f"body: {'send a JSON object' if body_type else e['msg']}")
                continue
            where = ".".join(str(p) for p in (loc[1:] if loc[:1] == ("body",) else loc))
            message = _wrong_type(e["type"], e.get("input")) or str(e["msg"]).removeprefix("Value error, ")
            parts.append(f"{where or 'body'}: {message}")
        return refusal(400, "; ".join(parts))

    for area in admin_areas(ctx):
        app.include_router(area)
    app.include_router(unbuilt.router())
    app.router.routes.extend(console_routes(ctx, pages))
    app.router.routes.extend(admin_pages(ctx))

    own = SpecRouter()
    cached: dict[str, Any] = {}

    @own.get("/api/v1/openapi.json", operation_id="getOpenapiJson", tags=["openapi"], response_model=dict[str, Any])
    async def get_openapi_json() -> dict[str, Any]:
        if not cached:
            cached.update(document(app))
        return cached

    app.include_router(own)
    return app


_EXPECTED = {
    "string_type": "a string",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
"""What a field of each JSON type takes, by the validation error of a value of another type."""


def _wrong_type(error: str, given: Any) -> str:
    """``send a boolean (true or false), not a string``: a value of another JSON type than its field's; ``""`` for any
    other refusal."""
    expected = _EXPECTED.get(error)
    if expected is None:
        return ""
    return f"send {expected}, not {_json_type(given)}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number with a decimal point"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__
