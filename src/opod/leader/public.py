"""The public listener's app (``/v1``, probes, the node join paths, ``/admin/v1``) and the plain probe listener's.

``/admin/v1`` needs the admin key, except register and heartbeat, which are
signed by workers instead. Every change made through it is recorded as an
``admin.call`` event. The probe listener (``OPOD_PROBE_LISTEN``) is built from
the probe routes alone, so nothing else can leak onto it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from opod import __version__
from opod.contract import nodeapi
from opod.http.errors import Unauthorized
from opod.http.fastpath import FastPath
from opod.leader.adminv1.context import AdminContext, AdminError
from opod.leader.adminv1.routes import loadz_response, router

if TYPE_CHECKING:
    from opod.leader.leader import Leader

SIGNED_PATHS = frozenset({nodeapi.PATH_REGISTER, nodeapi.PATH_HEARTBEAT})


def probe_routes(leader: Leader, ctx: AdminContext) -> list[Route]:
    metrics = CollectorRegistry()
    workers_gauge = Gauge("opod_workers_live", "Workers taking new work", registry=metrics)
    models_gauge = Gauge("opod_models_served", "Models served by at least one live worker", registry=metrics)
    in_flight = Gauge("opod_requests_in_flight", "/v1 requests being answered", registry=metrics)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        served = sorted(leader.fleet.served_models())
        if served:
            return JSONResponse({"ready": True, "models": served})
        wanted = [m.id for m in leader.models if m.wants_loaded()]
        why = f"no live worker serves a model yet (waiting for: {', '.join(wanted)})" if wanted else "no model is loaded; add one with opod model add"
        return JSONResponse({"ready": False, "reason": why}, status_code=503, headers={"Retry-After": "5"})

    async def loadz(request: Request) -> Response:
        return loadz_response(ctx)

    async def metrics_endpoint(request: Request) -> Response:
        workers_gauge.set(len(leader.fleet.live()))
        models_gauge.set(len(leader.fleet.served_models()))
        in_flight.set(ctx.stats.in_flight)
        return Response(generate_latest(metrics), media_type="text/plain; version=0.0.4")

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/loadz", loadz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]


def public_app(leader: Leader, ctx: AdminContext):
    assert leader.gateway is not None and leader.registry is not None
    app = FastAPI(title="opod", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def admin_key(request: Request, call_next):
        path = request.url.path
        if not path.startswith("/admin/v1/") or path in SIGNED_PATHS:
            return await call_next(request)
        try:
            leader.keys.check(request.headers.get("authorization"), kinds=("admin",))
        except Unauthorized as err:
            message = err.message.replace("API key", "admin key") + " The admin key is in ~/.opod/admin.key on the leader."
            return AdminError(401, message, "unauthorized").response()
        response = await call_next(request)
        if request.method != "GET":
            ctx.emit("admin.call", path, {"method": request.method, "status": response.status_code})
        return response

    @app.exception_handler(AdminError)
    async def admin_error(request: Request, err: AdminError) -> Response:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in err.errors()]
        return AdminError(400, "; ".join(parts)).response()

    # Routes are added one by one (not include_router) so the app's route table lists every
    # /admin/v1 path itself: the frozen-route test walks it.
    for route in [*probe_routes(leader, ctx), *leader.registry.routes(), *leader.gateway.routes(), *router(ctx).routes]:
        app.router.routes.append(route)
    return FastPath(leader.gateway.handlers(), app)


def probe_app(leader: Leader, ctx: AdminContext) -> Starlette:
    return Starlette(routes=probe_routes(leader, ctx))
