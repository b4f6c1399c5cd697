"""The members' portal's routes, put together once, for the public listener under ``/portal``.

The portal is built as the console is (:mod:`opod.control.console`): server-rendered pages over the
same services as ``/api/v1``, one :class:`~opod.control.console.auth.PageAuth` for who is signed in,
and the console's layout, style sheet and script (one copy of each, in the console's package); its
own templates and the playground's script are this package's files, served from the wheel.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from opod.control.console.auth import PageAuth
from opod.control.console.kit import Console, site_templates
from opod.control.context import ControlContext
from opod.control.portal.keys_pages import PortalKeyPages
from opod.control.portal.pages import PREFIX, PortalPages

NAV = (
    ("models", "Models", ""),
    ("keys", "Keys", "/keys"),
    ("usage", "Usage", "/usage"),
    ("playground", "Playground", "/playground"),
)

TEMPLATES = site_templates(site="portal", prefix=PREFIX, nav=NAV, package="opod.control.portal")


def portal_routes(ctx: ControlContext, auth: PageAuth) -> list[BaseRoute]:
    """Every route of the portal, under ``/portal``; its assets under ``/portal/static`` (the console's and its own)."""
    portal = Console(auth, ctx.store, TEMPLATES, reads="")  # a member's pages: every signed-in person has some
    pages = PortalPages(
        portal,
        people=ctx.people,
        tenancy=ctx.tenancy,
        fleet=ctx.fleet,
        models=ctx.models,
        store=ctx.store,
        budgets=ctx.budgets,
        settings=ctx.settings,
    )
    assets = StaticFiles(packages=[("opod.control.portal", "static"), ("opod.control.console", "static")])
    return [
        *pages.routes(),
        *PortalKeyPages(portal, keys=ctx.keys, people=ctx.people, tenancy=ctx.tenancy).routes(),
        Mount(f"{PREFIX}/static", assets, name="portal-static"),
    ]
