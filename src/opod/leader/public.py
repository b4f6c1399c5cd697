"""The public listener's app (``/v1``, probes, the node join paths, ``/admin/v1``) and the plain probe listener's.

``/admin/v1`` needs the admin key, except register and heartbeat, which are
signed by workers instead. Every change made through it is recorded as an
``admin.call`` event and in the audit log (``opod.control.audit``). The probe listener (``OPOD_PROBE_LISTEN``) is built from
the probe routes alone, so nothing else can leak onto it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.base import RequestResponseEndpoint
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from opod import __version__
from opod.access.keytable import KeyTable
from opod.contract import nodeapi
from opod.control.audit import open_draft, record_after
from opod.control.listener import ACTOR
from opod.control.scim_wire import PREFIX as SCIM_PREFIX
from opod.control.scim_wire import ScimError
from opod.fleet.federation import CLUSTER_HEADER
from opod.http.errors import BadRequest, Unauthorized, UnknownRoute, cut, error_response
from opod.http.fastpath import FastPath, Handler
from opod.http.inbound import check_nesting, json_value, request_id_for
from opod.leader.adminv1.context import AdminContext, AdminError
from opod.leader.adminv1.routes import loadz_response, router
from opod.leader.webhooks import WebhookCounts

log = logging.getLogger("opod.leader")

SIGNED_PATHS = frozenset({nodeapi.PATH_REGISTER, nodeapi.PATH_HEARTBEAT})


class DataPath(Protocol):
    """What the public app needs of the ``/v1`` gateway: its routes, and the same as hot-route handlers."""

    def routes(self) -> list[Route]: ...

    def handlers(self) -> Mapping[tuple[str, str], Handler]: ...


class WebhookCollector(Collector):
    """``opod_webhook_events_total{outcome}``: what became of the events offered to the settings' webhooks."""

    OUTCOMES = ("queued", "delivered", "retried", "failed", "dropped")

    def __init__(self, counts: WebhookCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "opod_webhook_events", "Webhook events by what became of them (retried counts attempts)", labels=["outcome"]
        )
        for outcome in self.OUTCOMES:
            family.add_metric([outcome], getattr(self.counts, outcome))
        yield family


def probe_routes(ctx: AdminContext) -> list[Route]:
    metrics = CollectorRegistry()
    workers_gauge = Gauge("opod_workers_live", "Workers taking new work", registry=metrics)
    models_gauge = Gauge("opod_models_served", "Models served by at least one live worker", registry=metrics)
    in_flight = Gauge("opod_requests_in_flight", "/v1 requests being answered", registry=metrics)
    if ctx.webhook_counts is not None:
        metrics.register(WebhookCollector(ctx.webhook_counts))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        """Ready while some model serves; each wanted model that cannot is named with why (the 503's words).
        Every answer names this cluster, as a federation peer that checks it shows it."""
        response = _readiness(request)
        if ctx.cluster:
            response.headers[CLUSTER_HEADER] = ctx.cluster
        return response

    def _readiness(request: Request) -> Response:
        if ctx.stopping():
            return JSONResponse(
                {
                    "ready": False,
                    "reason": "the node is stopping: it takes no new requests while those in flight finish",
                },
                status_code=503,
                headers={"Retry-After": "5"},
            )
        now = time.monotonic()
        served = sorted(ctx.fleet.served_models(now))
        down = {m.id: ctx.fleet.availability(m.id, now) for m in ctx.models if m.wants_loaded() and m.id not in served}
        not_serving = {model: availability.why() for model, availability in down.items()}
        if served:
            body: dict[str, bool | list[str] | dict[str, str]] = {"ready": True, "models": served}
            if not_serving:
                body["not_serving"] = not_serving
            return JSONResponse(body)
        if down:
            why = "no model can serve yet: " + "; ".join(f"{model}: {reason}" for model, reason in not_serving.items())
            wait = min(availability.retry_after() for availability in down.values())
        else:
            why, wait = "no model is loaded; add one with opod model add", 5
        return JSONResponse(
            {"ready": False, "reason": why, "not_serving": not_serving},
            status_code=503,
            headers={"Retry-After": str(wait)},
        )

    async def loadz(request: Request) -> Response:
        return loadz_response(ctx)

    async def metrics_endpoint(request: Request) -> Response:
        workers_gauge.set(len(ctx.fleet.live()))
        models_gauge.set(len(ctx.fleet.served_models()))
        in_flight.set(ctx.stats.in_flight)
        return Response(generate_latest(metrics), media_type="text/plain; version=0.0.4")

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/loadz", loadz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]


def public_app(
    ctx: AdminContext,
    keys: KeyTable,
    join_routes: list[Route],
    data_path: DataPath,
    area_routes: Sequence[BaseRoute] = (),
    client_routes: Sequence[Route] = (),
) -> FastPath:
    """``/v1`` from ``data_path``, the join paths, the probes and ``/admin/v1`` behind the admin key in ``keys``.

    ``client_routes`` (``/v1/files``, ``/v1/batches``) go before ``data_path``'s, whose last route answers every other ``/v1`` path.
    """
    app = FastAPI(title="opod", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def admin_key(request: Request, call_next: RequestResponseEndpoint) -> Response:
        path = request.url.path
        if path.startswith(SCIM_PREFIX) and request.method not in ("GET", "HEAD"):
            try:
                check_nesting(await request.body())  # before SCIM's parser recurses into it
            except BadRequest as err:
                return ScimError(400, err.message, "invalidSyntax").response()
        if not path.startswith("/admin/v1/") or path in SIGNED_PATHS:
            return await call_next(request)
        try:
            keys.check(request.headers.get("authorization"), kinds=("admin",))
        except Unauthorized as err:
            return AdminError(401, err.message, "unauthorized").response()
        if request.method in ("GET", "HEAD"):
            return await call_next(request)
        body = await request.body()
        try:
            if body.strip() and _as_json(request.headers.get("content-type")):
                json_value(body)  # the rules of every client's JSON, before the draft's parse and FastAPI's
        except BadRequest as err:
            return AdminError(400, err.message).response()
        actor = request.headers.get("x-llmgw-actor", "")
        draft = open_draft(request, actor if ACTOR.fullmatch(actor) else "unknown", body)
        response = await call_next(request)
        ctx.emit("admin.call", path, {"method": request.method, "status": response.status_code})
        await record_after(ctx.store, request, draft, response.status_code)
        return response

    @app.exception_handler(AdminError)
    async def admin_error(request: Request, err: AdminError) -> Response:
        return err.response()

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, err: HTTPException) -> Response:
        """A path no route matches (one with a newline in it, say), in the error shape of the API it is under."""
        path, method = request.url.path, request.method
        if path == "/v1" or path.startswith("/v1/"):
            known = sorted({known for _, known in data_path.handlers()} | {"/v1/models/{id}"})
            return error_response(UnknownRoute(method, path, known), request_id_for(request))
        if path == "/admin/v1" or path.startswith("/admin/v1/"):
            missing = err.status_code == 404
            what, kind = ("no such path", "not_found") if missing else ("not answered", "method_not_allowed")
            return AdminError(err.status_code, f"{what}: {method} {cut(path)}", kind).response()
        return JSONResponse({"detail": err.detail}, status_code=err.status_code, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in err.errors()]
        return AdminError(400, "; ".join(parts)).response()

    # Routes are added one by one (not include_router) so the app's route table lists every
    # /admin/v1 path itself: the frozen-route test walks it.
    # ``area_routes`` (opod.control.areas.public_areas): SCIM (``/scim/v2``) checks its own bearer token, as an identity
    # provider calls it from outside; the members' portal (``/portal``) its visitors' sessions and CSRF tokens.
    for route in [
        *probe_routes(ctx),
        *join_routes,
        *client_routes,
        *data_path.routes(),
        *router(ctx).routes,
        *area_routes,
    ]:
        app.router.routes.append(route)
    # The join paths are hot too: a fleet of a thousand workers heartbeats two hundred times a second.
    joins = {
        (method, route.path): route.endpoint
        for route in join_routes
        for method in (route.methods or ())
        if method != "HEAD"
    }
    return FastPath({**data_path.handlers(), **joins}, app)


def _as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body sent with this ``Content-Type`` as JSON (no type at all included)."""
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def probe_app(ctx: AdminContext) -> Starlette:
    return Starlette(routes=probe_routes(ctx))
