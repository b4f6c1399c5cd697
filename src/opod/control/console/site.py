"""The console's routes, put together once: each page module's, and its own script and style sheet.

The pages are built over the same services as ``/api/v1`` (the fields of
:class:`~opod.control.context.ControlContext`) and one :class:`~opod.control.console.auth.PageAuth`,
the seam sign-in plugs into. Every asset is a file of this package, served from the wheel.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from opod.control.console.auth import PageAuth
from opod.control.console.batch_pages import BatchPages
from opod.control.console.canary_pages import CanaryPages
from opod.control.console.eval_pages import EvalPages
from opod.control.console.fleet_pages import FleetPages
from opod.control.console.keys_pages import KeyPages
from opod.control.console.kit import PREFIX, Console
from opod.control.console.records_pages import RecordPages
from opod.control.console.serve_pages import ServePages
from opod.control.console.settings_pages import SettingsPages
from opod.control.context import ControlContext


def console_routes(ctx: ControlContext, auth: PageAuth) -> list[BaseRoute]:
    """Every route of the console, under ``/console``."""
    console = Console(auth, ctx.store)
    fleet = FleetPages(
        console,
        fleet=ctx.fleet,
        models=ctx.models,
        desk=ctx.reconciler,
        nodes=ctx.nodes,
        models_service=ctx.models_service,
        presets=ctx.presets,
        stats=ctx.stats,
        store=ctx.store,
    )
    return [
        *fleet.routes(),
        *KeyPages(console, keys=ctx.keys, tenancy=ctx.tenancy).routes(),
        *RecordPages(console, store=ctx.store, tenancy=ctx.tenancy).routes(),
        *SettingsPages(console, settings=ctx.settings_service).routes(),
        *ServePages(console, serving=ctx.serve_jobs).routes(),
        *BatchPages(console, store=ctx.store, batches=ctx.batches).routes(),
        *CanaryPages(console, canaries=ctx.canaries, models=ctx.models).routes(),
        *EvalPages(console, evals=ctx.evals, models=ctx.models).routes(),
        Mount(f"{PREFIX}/static", StaticFiles(packages=[("opod.control.console", "static")]), name="console-static"),
    ]
