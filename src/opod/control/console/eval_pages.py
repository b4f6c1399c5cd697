"""The console's quality runs: the latest runs (of one model, or all), a run's page live while it runs with each of
its cases, and starting a run of a suite on a model.

Runs are read and started through :class:`~opod.control.evals.service.EvalsService`, as
``/api/v1/eval/runs`` and ``POST /api/v1/models/{name}/eval`` do: a run that runs on this leader is
shown as it stands (its cases so far, the score of those), one that ended as the store keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.control.console.auth import OPERATE, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, page_size, whole
from opod.control.console.live import stream_block
from opod.control.evals.service import MAX_CONCURRENCY, EvalsService, RunAsk
from opod.fleet.models import ModelRegistry
from opod.store.audit import AuditDraft
from opod.store.evals import LIST_MAX

MODEL_CHARS = 200


def _score(text: str | None, field: str) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise Refused(400, f"{field}: {text!r} is not a score; give one from 0 to 1") from None
    if not 0 <= value <= 1:
        raise Refused(400, f"{field}: {value} is not a score from 0 to 1 (empty takes the suite's own threshold)")
    return value


class EvalPages:
    """Quality runs over :class:`EvalsService`; the models offered to run on are the registry's."""

    def __init__(self, console: Console, *, evals: EvalsService, models: ModelRegistry) -> None:
        self.console = console
        self.evals = evals
        self.models = models

    def routes(self) -> list[BaseRoute]:
        c = self.console
        return [
            Route(f"{PREFIX}/evals", c.page(self.runs_page), methods=["GET"]),
            Route(
                f"{PREFIX}/evals", c.action(OPERATE, "POST /api/v1/models/{name}/eval", self.start), methods=["POST"]
            ),
            Route(f"{PREFIX}/evals/{{id}}", c.page(self.run_page), methods=["GET"]),
            Route(f"{PREFIX}/evals/{{id}}/live", c.page(self.run_stream), methods=["GET"]),
        ]

    async def runs_page(self, request: Request, viewer: Viewer) -> Response:
        model = request.query_params.get("model", "").strip()
        if len(model) > MODEL_CHARS:
            raise Refused(400, f"model: longer than {MODEL_CHARS} characters; name a model of the catalog")
        limit = min(page_size(request), LIST_MAX)
        runs = await self.evals.runs(model or None, limit)
        found, broken = self.evals.suites()
        values = {
            "title": "Eval runs",
            "rows": runs,
            "limit": limit,
            "model": model,
            "models": sorted(m.id for m in self.models if not m.removed),
            "suites": found,
            "broken": broken,
            "most_concurrency": MAX_CONCURRENCY,
        }
        return self.console.render(request, viewer, "evals.html", values)

    async def run_page(self, request: Request, viewer: Viewer) -> Response:
        run = await self.evals.get(request.path_params["id"])
        return self.console.render(request, viewer, "eval_run.html", {"title": f"Eval run {run.id}", "run": run})

    async def run_stream(self, request: Request, viewer: Viewer) -> Response:
        """The run's score and cases as they are scored, until it ends."""
        run_id = request.path_params["id"]
        await self.evals.get(run_id)

        async def look() -> tuple[Mapping[str, Any], bool]:
            run = await self.evals.get(run_id)
            return {"run": run}, run.state != "running"

        return stream_block(request, self.console.templates, "eval_run.html", "live", look, name="run")

    async def start(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        name = fields.get("model", "").strip()
        if not name:
            raise Refused(400, "model: name the model to run the suite on")
        draft.target = f"model:{name}"
        ask = RunAsk(
            suite=fields.get("suite", "").strip() or None,
            concurrency=whole(fields.get("concurrency"), "concurrency", low=1, high=MAX_CONCURRENCY),
            judge=fields.get("judge", "").strip() or None,
            min_score=_score(fields.get("min_score"), "min_score"),
        )
        draft.body = {k: v for k, v in asdict(ask).items() if v is not None}
        draft.status = 202  # as the API answers it: started, followed on its page
        run = await self.evals.start(name, ask, draft)
        return Done(
            f"run {run.id} of suite {run.suite} on {run.model} started",
            refresh="",
            data={"run": run.id, "location": f"{PREFIX}/evals/{run.id}"},
        )
