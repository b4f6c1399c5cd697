"""The console's canaries: each with what its stable model and its candidate served since it was set, and the
changes ``/api/v1`` makes to one (start, share, promote, stop) through the same service.

The figures are :meth:`~opod.fleet.canaries_service.CanariesService.views`, as ``GET /canaries`` answers
them, turned into what an operator compares: requests, error rate, mean time to the first token and the
share each side took. Promotions and starts answer a job, kept by the service; the latest are listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import CanarySide, ModelserveCanaryView, ModelserveChange
from opod.control.console.auth import OPERATE, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, whole
from opod.fleet.canaries import in_force
from opod.fleet.canaries_service import CanariesService
from opod.fleet.models import ModelRegistry
from opod.store.audit import AuditDraft

JOBS_SHOWN = 10


@dataclass(frozen=True, slots=True)
class SideFigures:
    """One side of a canary as the page compares it."""

    model: str
    requests: int
    errors: int
    error_rate: float
    ttft_ms: float | None
    """Mean time to the first token of its streamed answers; ``None`` before its first."""
    latency_ms: float | None
    """Mean time of its whole answers (not streamed); ``None`` before its first."""
    share: float
    """Its part of both sides' requests since the canary was set."""


@dataclass(frozen=True, slots=True)
class CanaryRow:
    model: str
    candidate: str
    percent: int
    shadow: bool
    min_requests: int
    max_error_increase: float
    max_ttft_ratio: float
    since: str
    stable: SideFigures
    cand: SideFigures


def _side(model: str, side: CanarySide | None, both: int) -> SideFigures:
    side = side or CanarySide()
    requests, errors = side.requests or 0, side.errors or 0
    return SideFigures(
        model=model,
        requests=requests,
        errors=errors,
        error_rate=errors / requests if requests else 0.0,
        ttft_ms=side.ttft_ms if side.ttft_count else None,
        latency_ms=side.latency_ms if side.latency_count else None,
        share=requests / both if both else 0.0,
    )


def canary_row(view: ModelserveCanaryView) -> CanaryRow:
    canary = in_force(view.canary or CatalogCanary())
    serving = view.serving
    stable = serving.stable if serving is not None else None
    cand = serving.candidate if serving is not None else None
    shadow = not canary.percent
    # In shadow the candidate answers a copy of each request: its share of the clients' requests is none.
    served = (stable.requests or 0) if stable is not None else 0
    taken = (cand.requests or 0) if cand is not None and not shadow else 0
    both = served + taken
    since = serving.since if serving is not None else None
    return CanaryRow(
        model=view.model or "",
        candidate=canary.model or "",
        percent=canary.percent or 0,
        shadow=shadow,
        min_requests=canary.min_requests or 0,
        max_error_increase=canary.max_error_increase or 0.0,
        max_ttft_ratio=canary.max_ttft_ratio or 0.0,
        since=since.strftime("%Y-%m-%d %H:%M:%S") if since is not None else "",
        stable=_side(view.model or "", stable, both),
        cand=_side(canary.model or "", cand, 0 if shadow else both),
    )


def _figure(text: str | None, field: str, *, low: float, high: float) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise Refused(400, f"{field}: {text!r} is not a number; give one from {low} to {high}") from None
    if not low <= value <= high:
        raise Refused(400, f"{field}: {value} is outside {low}..{high}")
    return value


class CanaryPages:
    """The canaries page and its changes over :class:`CanariesService`."""

    def __init__(self, console: Console, *, canaries: CanariesService, models: ModelRegistry) -> None:
        self.console = console
        self.canaries = canaries
        self.models = models

    def routes(self) -> list[BaseRoute]:
        c = self.console
        model = f"{PREFIX}/canaries/{{name}}"
        return [
            Route(f"{PREFIX}/canaries", c.page(self.canaries_page), methods=["GET"]),
            Route(
                f"{PREFIX}/canaries",
                c.action(OPERATE, "POST /api/v1/models/{name}/canary", self.start),
                methods=["POST"],
            ),
            Route(
                f"{model}/share",
                c.action(OPERATE, "PUT /api/v1/models/{name}/canary", self.share, target="model:{name}"),
                methods=["POST"],
            ),
            Route(
                f"{model}/stop",
                c.action(OPERATE, "DELETE /api/v1/models/{name}/canary", self.stop, target="model:{name}"),
                methods=["POST"],
            ),
            Route(
                f"{model}/promote",
                c.action(OPERATE, "POST /api/v1/models/{name}/promote", self.promote, target="model:{name}"),
                methods=["POST"],
            ),
        ]

    async def canaries_page(self, request: Request, viewer: Viewer) -> Response:
        rows = [canary_row(v) for v in self.canaries.views()]
        names = sorted(m.id for m in self.models if not m.removed)
        values = {
            "title": "Canaries",
            "rows": rows,
            "jobs": await self.canaries.recent_jobs(JOBS_SHOWN),
            "models": names,
        }
        return self.console.render(request, viewer, "canaries.html", values)

    async def start(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = fields.get("model", "").strip()
        if not name:
            raise Refused(400, "model: name the model whose requests the candidate shares")
        draft.target = f"model:{name}"
        body = CatalogCanary(
            model=fields.get("candidate", "").strip(),
            percent=whole(fields.get("percent"), "percent", low=0, high=100, default=0),
            min_requests=whole(fields.get("min_requests"), "min_requests", low=0, high=1_000_000),
            max_error_increase=_figure(fields.get("max_error_increase"), "max_error_increase", low=0, high=1),
            max_ttft_ratio=_figure(fields.get("max_ttft_ratio"), "max_ttft_ratio", low=0, high=1_000),
        )
        draft.body = body.model_dump(mode="json", exclude_none=True)
        draft.status = 202  # as the API answers it: started, followed on its page
        job = await self.canaries.start(name, body, draft)
        return Done(f"canary {body.model} of {name} started (job {job.id})")

    async def share(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = request.path_params["name"]
        percent = whole(fields.get("percent"), "percent", low=0, high=100)
        draft.body = {"percent": percent}
        return Done(await self.canaries.set_percent(name, percent, draft), refresh="figures")

    async def stop(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        return Done(await self.canaries.remove(request.path_params["name"], draft))

    async def promote(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = request.path_params["name"]
        skip = (fields.get("skip_eval") or "").strip().lower() in ("on", "true", "1", "yes")
        change = ModelserveChange(skip_eval=True) if skip else None
        draft.body = {"skip_eval": True} if skip else None
        draft.status = 202  # as the API answers it: started, followed on its page
        job = await self.canaries.promote(name, change, draft)
        said = f": {job.error}" if job.error else ""
        return Done(f"promotion of {name}'s candidate: job {job.id} {job.state}{said}")
