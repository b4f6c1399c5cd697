"""The console's pages of the fleet: the summary, nodes (drain, cordon, make ready) and models (scale, class, presets).

Everything shown is read from the leader's memory (the fleet, the models, the reconciler's
replicas), as ``/api/v1/nodes``, ``/models`` and ``/summary`` read it; a list is filtered and cut to
one page here, so a page of a thousand nodes renders fifty rows. Changes go through the services
``/api/v1`` calls (:class:`~opod.fleet.nodes_service.NodesService`,
:class:`~opod.fleet.models_service.ModelsService`, :class:`~opod.fleet.presets_service.PresetsService`).
A model's replicas stream to its page as server-sent events while it is open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from opod.catalog.definition import class_in_force, scaling_in_force, with_defaults
from opod.contract.admin.fleet import RestartRequest
from opod.control.console.auth import OPERATE, Viewer
from opod.control.console.kit import PREFIX, TEMPLATES, Console, Done, Refused, link, page_size, whole
from opod.control.context import ReplicaDesk
from opod.control.node_views import held_devices, state_word
from opod.control.replica_views import replica_view, summary
from opod.control.restarts import restart
from opod.control.usage_export import totals
from opod.fleet.models import ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService
from opod.fleet.nodes_service import NodesService
from opod.fleet.presets_service import PresetsService
from opod.fleet.state import Fleet, NodeState
from opod.gateway.stats import WINDOW, GatewayStats
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.offloop import run_sync

NODE_STATES = ("ready", "cordoned", "draining", "unreachable", "lost")
STATE_ACTIONS = {"drain": "drain", "cordon": "cordon", "ready": "ready"}
STREAM_EVERY = 1.0
"""Seconds between two updates of a model's replicas on its page."""
STREAM_FOR = 600.0
"""Seconds a page's stream stays open; the browser opens it again by itself."""


@dataclass(frozen=True, slots=True)
class GpuBar:
    klass: str
    total: int
    used: int
    unhealthy: int


@dataclass(frozen=True, slots=True)
class NodeRow:
    id: str
    hostname: str
    state: str
    bars: list[GpuBar]
    labels: dict[str, str]
    models: int


def _bars(node: NodeState, held: set[int]) -> list[GpuBar]:
    counts: dict[str, list[int]] = {}
    for device in node.inventory.gpus:
        row = counts.setdefault(device.gpu_class, [0, 0, 0])
        row[0] += 1
        if not device.healthy:
            row[2] += 1
        elif device.index in held:
            row[1] += 1
    return [GpuBar(k, t, u, h) for k, (t, u, h) in sorted(counts.items())]


def _matches(node: NodeState, needle: str) -> bool:
    if not needle:
        return True
    if needle in node.id.lower() or needle in (node.hostname or "").lower():
        return True
    return any(needle in f"{k}={v}".lower() for k, v in node.inventory.all_labels().items())


class FleetPages:
    """The summary, node and model pages over the leader's memory and the fleet's services."""

    def __init__(
        self,
        console: Console,
        *,
        fleet: Fleet,
        models: ModelRegistry,
        desk: ReplicaDesk,
        nodes: NodesService,
        models_service: ModelsService,
        presets: PresetsService,
        stats: GatewayStats,
        store: Store,
    ) -> None:
        self.console = console
        self.fleet = fleet
        self.models = models
        self.desk = desk
        self.nodes = nodes
        self.models_service = models_service
        self.presets = presets
        self.stats = stats
        self.store = store

    def routes(self) -> list[BaseRoute]:
        c = self.console
        return [
            Route(PREFIX, c.page(self.summary_page), methods=["GET"]),
            Route(f"{PREFIX}/nodes", c.page(self.nodes_page), methods=["GET"]),
            Route(
                f"{PREFIX}/nodes/{{id}}/state",
                c.action(OPERATE, "POST /api/v1/nodes/{id}/state", self.set_state, target="node:{id}"),
                methods=["POST"],
            ),
            Route(f"{PREFIX}/models", c.page(self.models_page), methods=["GET"]),
            Route(f"{PREFIX}/models/{{name}}", c.page(self.model_page), methods=["GET"]),
            Route(f"{PREFIX}/models/{{name}}/replicas", c.page(self.replica_stream), methods=["GET"]),
            Route(
                f"{PREFIX}/models/{{name}}/scale",
                c.action(OPERATE, "POST /api/v1/models/{name}/scale", self.scale, target="model:{name}"),
                methods=["POST"],
            ),
            Route(
                f"{PREFIX}/models/{{name}}/restart",
                c.action(OPERATE, "POST /api/v1/restart", self.restart, target="model:{name}"),
                methods=["POST"],
            ),
            Route(
                f"{PREFIX}/models/{{name}}/class",
                c.action(OPERATE, "POST /api/v1/models/{name}/class", self.set_class, target="model:{name}"),
                methods=["POST"],
            ),
            Route(
                f"{PREFIX}/presets/{{name}}",
                c.action(OPERATE, "POST /api/v1/presets/{name}", self.add_preset),
                methods=["POST"],
            ),
        ]

    # --- summary -----------------------------------------------------------------------------

    async def summary_page(self, request: Request, viewer: Viewer) -> Response:
        view = summary(self.models, self.fleet, self.desk)
        now = datetime.now(UTC)
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        requests = errors = cost = 0
        async for found in totals(self.store, "day", [], day, now):
            for row in found:
                requests, errors, cost = requests + row.requests, errors + row.errors, cost + row.cost_micros
        clock = time.time()
        values = {
            "title": "Summary",
            "summary": view,
            "per_second": round(self.stats.requests.total(clock) / WINDOW, 2),
            "errors_minute": self.stats.unavailable.total(clock),
            "in_flight": self.stats.in_flight,
            "today": {"requests": requests, "errors": errors, "cost": cost},
        }
        return self.console.render(request, viewer, "summary.html", values)

    # --- nodes -------------------------------------------------------------------------------

    async def nodes_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        needle = q.get("q", "").strip().lower()
        state = q.get("state", "").strip().lower()
        if state and state not in NODE_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(NODE_STATES)}")
        size = page_size(request)
        now, wall = time.monotonic(), time.time()
        chosen = []
        for node in sorted(self.fleet, key=lambda n: n.id):
            if not _matches(node, needle):
                continue
            word = state_word(node, now, wall)
            if state and word != state:
                continue
            chosen.append((node, word))
        pages = max(1, -(-len(chosen) // size))
        number = whole(q.get("page"), "page", low=1, high=pages, default=1) or 1
        held = held_devices(self.desk.replica_list())
        rows = [
            NodeRow(
                id=node.id,
                hostname=node.hostname or node.hardware.hostname,
                state=word,
                bars=_bars(node, held.get(node.id, set())),
                labels=node.inventory.all_labels(),
                models=len({*node.loaded_models, *node.model_engines}),
            )
            for node, word in chosen[(number - 1) * size : number * size]
        ]
        values = {
            "title": "Nodes",
            "rows": rows,
            "total": len(chosen),
            "all": len(self.fleet),
            "page": number,
            "pages": pages,
            "states": NODE_STATES,
            "earlier": link(request, page=number - 1) if number > 1 else "",
            "later": link(request, page=number + 1) if number < pages else "",
        }
        return self.console.render(request, viewer, "nodes.html", values)

    async def set_state(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        node_id = request.path_params["id"]
        state = fields.get("state", "")
        if state not in STATE_ACTIONS:
            raise Refused(400, f"state: {state!r} is not one of drain, cordon, ready")
        draft.body = {"state": state}
        now = await self.nodes.set_state(node_id, state, draft)
        return Done(f"{node_id} is {now}")

    # --- models ------------------------------------------------------------------------------

    def _model_rows(self) -> list[dict[str, object]]:
        rows = []
        for model in sorted(self.models, key=lambda m: m.id):
            if model.removed:
                continue
            filled = with_defaults(definition_of(model), model.entry, model.engine)
            low, high, _, _ = scaling_in_force(filled)
            rows.append(
                {
                    "name": model.id,
                    "state": self.desk.status(model.id),
                    "ready": len(self.fleet.workers_for(model.id)),
                    "desired": model.status.desired,
                    "min": low,
                    "max": high,
                    "klass": class_in_force(filled),
                }
            )
        return rows

    async def models_page(self, request: Request, viewer: Viewer) -> Response:
        needle = request.query_params.get("q", "").strip().lower()
        rows = [r for r in self._model_rows() if not needle or needle in str(r["name"]).lower()]
        presets = (await self.presets.view()).presets or []
        values = {"title": "Models", "rows": rows, "presets": [p for p in presets if not p.in_catalog]}
        return self.console.render(request, viewer, "models.html", values)

    def _replicas(self, name: str) -> Mapping[str, Any]:
        """The model's replicas, and which each took over from: a restart is done for one once it is ready and the
        replica it replaces is no longer listed (stopped)."""
        now = time.monotonic()
        mine = [r for r in self.desk.replica_list() if r.model == name]
        return {
            "replicas": [replica_view(self.models, self.fleet, self.desk, r, now) for r in mine],
            "took_over": {r.id: r.replaces for r in mine if r.replaces},
            "listed": {r.id for r in mine},
        }

    async def model_page(self, request: Request, viewer: Viewer) -> Response:
        name = request.path_params["name"]
        model = self.models_service.named(name)
        filled = with_defaults(definition_of(model), model.entry, model.engine)
        low, high, _, _ = scaling_in_force(filled)
        rejections = self.desk.last_rejections.get(name, [])
        several = len({r.profile for r in rejections}) > 1
        values = {
            "title": name,
            "name": name,
            "state": self.desk.status(name),
            "min": low,
            "max": high,
            "klass": class_in_force(filled),
            "profiles": [p.name or p.engine or str(i) for i, p in enumerate(filled.profiles or [])],
            **self._replicas(name),
            "placement": [f"{r.node}{f' ({r.profile})' if several else ''}: {r.reason}" for r in rejections],
        }
        return self.console.render(request, viewer, "model.html", values)

    async def replica_stream(self, request: Request, viewer: Viewer) -> Response:
        """The model's replicas as server-sent events: the rows again each time they change, until the page closes."""
        name = request.path_params["name"]
        self.models_service.named(name)
        rows = TEMPLATES.get_template("model.html").blocks["replica_rows"]

        async def events() -> AsyncIterator[str]:
            last = ""
            ends = time.monotonic() + STREAM_FOR
            yield "retry: 2000\n\n"
            while time.monotonic() < ends and not await request.is_disconnected():
                html = "".join(rows(TEMPLATES.get_template("model.html").new_context(dict(self._replicas(name)))))
                if html != last:
                    last = html
                    yield "event: replicas\n" + "".join(f"data: {line}\n" for line in html.splitlines() or [""]) + "\n"
                await asyncio.sleep(STREAM_EVERY)

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    async def scale(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = request.path_params["name"]
        low = whole(fields.get("min"), "min", low=0, high=10_000)
        high = whole(fields.get("max"), "max", low=0, high=10_000)
        draft.body = {"min": low, "max": high}
        await self.models_service.scale(name, draft, low=low, high=high, idle_timeout=None)
        return Done(
            f"{name} scales from {low if low is not None else 'its minimum'} to {high if high is not None else 'its minimum'}",
            refresh="facts",
        )

    async def restart(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        """A rolling restart of the model's replicas, as ``POST /api/v1/restart`` with ``models: [name]`` makes it."""
        name = request.path_params["name"]
        self.models_service.named(name)
        asked = RestartRequest(models=[name])
        draft.body = asked.model_dump(mode="json", exclude_none=True)
        queued = restart(self.models, self.desk, asked).queued or []
        with draft.commit(status=202) as row:  # as the API answers it: queued, followed on the page
            await run_sync(self.store.record_audit, row)
        if not queued:
            return Done(f"{name} has no starting or ready replica to restart", refresh="")
        return Done(f"{name}: restarting {', '.join(queued)}, one by one; the replicas below show how far", refresh="")

    async def set_class(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = request.path_params["name"]
        klass = fields.get("class", "").strip()
        draft.body = {"class": klass}
        await self.models_service.set_class(name, klass, draft)
        return Done(f"{name}'s class is {klass or 'what its scaling implies'}", refresh="facts")

    async def add_preset(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = request.path_params["name"]
        added = await self.presets.add(name, draft)
        return Done(f"preset {name} added as model {added}")
