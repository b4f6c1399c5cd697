"""The management API's built areas, one list per listener, each area given only what it uses.

An area is a route module under ``control/`` (thin handlers: parse, call one service method,
answer) over a service beside the state it changes (``access``, ``fleet``, ``settings``). To add
one: write the service and the route module, add its line here, and delete its operations'
rows from :data:`opod.control.unbuilt.UNBUILT`; ``tests/control/test_unbuilt.py`` checks that
every operation of the spec is in exactly one of the two.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.routing import BaseRoute, Route

from opod.control import (
    accounts,
    adapters,
    audit_log,
    canaries,
    capacity,
    client_jobs,
    evaluations,
    federation,
    guard,
    keys,
    metrics,
    models,
    nodes,
    notify,
    people,
    presets,
    quotas,
    replicas,
    requests,
    scim,
    serve,
    settings,
    tenancy,
    updates,
    usage,
    weights,
)
from opod.control.console.auth import PageAuth
from opod.control.context import ControlContext
from opod.control.portal.site import portal_routes
from opod.control.web import signin


def admin_areas(ctx: ControlContext) -> list[APIRouter]:
    """``/api/v1`` on the admin listener, in the order the document lists them."""
    return [
        keys.router(ctx.keys, ctx.tenancy),
        models.router(ctx.models_service, ctx.models, ctx.fleet, ctx.reconciler),
        nodes.router(ctx.nodes, ctx.fleet, ctx.reconciler),
        weights.router(ctx.models, ctx.catalog, ctx.fleet, ctx.workers, ctx.events),
        presets.router(ctx.presets),
        serve.router(ctx.serve_jobs),
        evaluations.router(ctx.evals),
        replicas.router(ctx.models, ctx.fleet, ctx.reconciler),
        capacity.router(ctx.models_service, ctx.models, ctx.fleet, ctx.reconciler),
        quotas.router(ctx.quotas),
        guard.router(ctx.guard),
        client_jobs.router(ctx.store, ctx.batches),
        audit_log.router(ctx.store),
        settings.router(ctx.settings_service),
        notify.router(ctx.notifier),
        metrics.router(ctx.settings),
        people.router(ctx.members, ctx.secrets, ctx.directory, ctx.signin),
        accounts.router(ctx.signin, ctx.members),
        tenancy.router(ctx.tenancy),
        usage.router(ctx.store, ctx.budgets, ctx.tenancy),
        requests.router(ctx.store, ctx.replay),
        federation.router(ctx.federation),
        canaries.router(ctx.canaries),
        adapters.router(ctx.adapters),
        updates.router(ctx.updates),
    ]


def admin_pages(ctx: ControlContext) -> list[Route]:
    """The web's pages on the admin listener, beside ``/api``: sign-in (operators)."""
    return signin.routes(ctx.signin, ctx.people, ctx.store, home=signin.console_home)


def public_areas(ctx: ControlContext, pages: PageAuth) -> list[BaseRoute]:
    """What the management layer serves on the public listener: SCIM 2.0 (``/scim/v2``), which identity providers
    call from outside with their own bearer token, the web's sign-in pages (members), and the members' portal
    (``/portal``), whose visitors ``pages`` says."""
    return [
        *scim.routes(ctx.people, ctx.tenancy, ctx.secrets, ctx.store, ctx.settings),
        *signin.routes(ctx.signin, ctx.people, ctx.store, home=signin.portal_home),
        *portal_routes(ctx, pages),
    ]
