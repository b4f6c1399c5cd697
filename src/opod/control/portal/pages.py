"""The portal's pages of what a person may use: the models, their own and their projects' usage, the playground.

The models are those served now (:meth:`opod.fleet.state.Fleet.served_models`) less those owned by
a scope the person is not in (:mod:`opod.control.portal.reach`). Usage is read as
``/api/v1/usage`` reads it (the store's totals by day, the budgets the gateway enforces,
:meth:`~opod.gateway.budgets.Budgets.budget_of`), kept to the person and their projects, and drawn
on the server. The playground calls ``/v1`` on this same listener from the page's own script, with
a key the person pastes (never sent to the portal, never stored); its snippets name this leader's
address and the model, the key left as a placeholder.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.access.scopes import Scope, id_kind
from opod.access.tenancy import Tenancy
from opod.control.console.auth import Viewer
from opod.control.console.kit import Console
from opod.control.console.records_pages import METRICS, add_day, daily_chart, day_range, each_day, metric_of
from opod.control.portal.reach import Memberships, Reach, reach_of
from opod.control.usage_export import totals
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.gateway.budgets import Budgets, period_bounds
from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.offloop import run_sync

PREFIX = "/portal"
KEY_PLACEHOLDER = "YOUR_API_KEY"
"""What the snippets say where the person's key goes."""


@dataclass(frozen=True, slots=True)
class UsableModel:
    id: str
    capabilities: tuple[str, ...]
    context: int | None
    owner: str
    """Who it is kept for, as people read it (``Acme / ml``); ``""`` for everyone."""
    aliases: tuple[str, ...]

    @property
    def embeds(self) -> bool:
        return "embedding" in self.capabilities

    @property
    def chats(self) -> bool:
        return "chat" in self.capabilities or not self.embeds


@dataclass(frozen=True, slots=True)
class Budget:
    micros: int
    period: str
    spent: int


class PortalPages:
    def __init__(
        self,
        portal: Console,
        *,
        people: Memberships,
        tenancy: Tenancy,
        fleet: Fleet,
        models: ModelRegistry,
        store: Store,
        budgets: Budgets,
        settings: SettingsHolder,
    ) -> None:
        self.portal = portal
        self.people = people
        self.tenancy = tenancy
        self.fleet = fleet
        self.models = models
        self.store = store
        self.budgets = budgets
        self.settings = settings

    def routes(self) -> list[BaseRoute]:
        page = self.portal.page
        return [
            Route(PREFIX, page(self.models_page), methods=["GET"]),
            Route(f"{PREFIX}/usage", page(self.usage_page), methods=["GET"]),
            Route(f"{PREFIX}/playground", page(self.playground_page), methods=["GET"]),
        ]

    def _reach(self, viewer: Viewer) -> Reach:
        return reach_of(viewer, self.people, self.tenancy)

    def usable(self, reach: Reach) -> list[UsableModel]:
        """The models served now that are for this person, by name."""
        out = []
        for name in sorted(self.fleet.served_models()):
            known = self.models.named(name)
            definition = known.definition if known is not None else None
            owner = (definition.owner or "") if definition is not None else ""
            if not reach.may_use(owner):
                continue
            out.append(
                UsableModel(
                    id=name,
                    capabilities=tuple(known.capabilities) if known is not None else ("chat",),
                    context=self.fleet.served_context(name),
                    owner=self._owner_name(owner),
                    aliases=tuple(definition.aliases or ()) if definition is not None else (),
                )
            )
        return out

    def _owner_name(self, owner: str) -> str:
        if not owner:
            return ""
        kind, _, ident = owner.partition(":")
        if kind in ("org", "team", "project") and id_kind(ident) == kind:
            return self.tenancy.name(Scope(kind, ident))
        return owner

    # --- models ------------------------------------------------------------------------------

    async def models_page(self, request: Request, viewer: Viewer) -> Response:
        reach = self._reach(viewer)
        values = {"title": "Models you may use", "models": self.usable(reach), "projects": reach.projects}
        return self.portal.render(request, viewer, "portal_models.html", values)

    # --- usage -------------------------------------------------------------------------------

    async def _budget(self, kind: str, ident: str, now: datetime) -> Budget | None:
        budget = self.budgets.budget_of(kind, ident)
        if budget is None:
            return None
        micros, period = budget
        spent = await run_sync(self.store.usage_spent_since, kind, ident, period_bounds(period, now)[0])
        return Budget(micros, period, spent)

    async def usage_page(self, request: Request, viewer: Viewer) -> Response:
        reach = self._reach(viewer)
        days, start, end = day_range(request)
        metric = metric_of(request)
        per_day = each_day(start, days)
        mine = {"requests": 0, "tokens": 0, "cost": 0, "errors": 0}
        if reach.user_id:
            async for found in totals(self.store, "day", ["user"], start, end):
                for row in found:
                    if row.dims["user"] == reach.user_id:
                        add_day(per_day, row)
                        mine["requests"] += row.requests
                        mine["tokens"] += row.prompt + row.completion
                        mine["cost"] += row.cost_micros
                        mine["errors"] += row.errors
        scopes = {t.id: t for t in await run_sync(self.store.usage_by_scope, "project", start)}
        projects = []
        for project in reach.projects:
            used = scopes.get(project.id)
            projects.append(
                {
                    "path": project.path,
                    "requests": used.requests if used else 0,
                    "tokens": used.prompt_tokens + used.completion_tokens if used else 0,
                    "cost": used.cost_micros if used else 0,
                    "budget": await self._budget("project", project.id, end),
                }
            )
        values = {
            "title": "Usage",
            "chart": daily_chart(per_day, metric),
            "metric": metric,
            "metric_name": METRICS[metric],
            "metrics": METRICS,
            "days": days,
            "mine": mine,
            "my_budget": await self._budget("user", reach.user_id, end) if reach.user_id else None,
            "projects": projects,
        }
        return self.portal.render(request, viewer, "portal_usage.html", values)

    # --- playground --------------------------------------------------------------------------

    def base_url(self, request: Request) -> str:
        """``/v1``'s address as people reach it: the settings' ``auth.base_url``, else the address this page was asked
        at."""
        base = self.settings.current.auth.base_url or str(request.base_url).rstrip("/")
        return f"{base}/v1"

    async def playground_page(self, request: Request, viewer: Viewer) -> Response:
        models = self.usable(self._reach(viewer))
        chat = [m.id for m in models if m.chats]
        embed = [m.id for m in models if m.embeds]
        wanted = request.query_params.get("model", "")
        values = {
            "title": "Playground",
            "chat_models": chat,
            "embed_models": embed,
            "chat_model": wanted if wanted in chat else (chat[0] if chat else "MODEL"),
            "embed_model": wanted if wanted in embed else (embed[0] if embed else "MODEL"),
            "base": self.base_url(request),
            "placeholder": KEY_PLACEHOLDER,
        }
        return self.portal.render(request, viewer, "portal_playground.html", values)
