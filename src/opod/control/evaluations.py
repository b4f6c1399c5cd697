"""``/api/v1/eval/*``, ``POST /api/v1/models/{name}/eval`` and a model's ``eval-gate``: quality suites and runs.

Thin handlers over :class:`~opod.control.evals.service.EvalsService`. A run answers 202 as it
starts and is followed at ``/api/v1/eval/runs/{id}`` (``state`` running, ``done`` of ``cases``,
the score so far); ``took_ms`` is milliseconds, as the spec names it.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.models import (
    EvalGateRequest,
    EvalGateView,
    EvalLive,
    EvalRequest,
    EvalSuiteInfo,
)
from opod.control.audit import audit_draft
from opod.control.evals.service import EvalsService, RunAsk
from opod.control.evals.views import live_view
from opod.control.spec import SpecRouter
from opod.store.audit import AuditDraft


def router(evals: EvalsService) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/eval/suites", operation_id="getEvalSuites", tags=["eval"], response_model=list[EvalSuiteInfo])
    async def get_eval_suites() -> list[EvalSuiteInfo]:
        found, broken = evals.suites()
        return [
            *(
                EvalSuiteInfo(
                    name=s.name,
                    from_=s.source,
                    description=s.description or None,
                    cases=len(s.cases),
                    threshold=s.threshold,
                    judge=s.judged,
                    hash=s.hash,
                )
                for s in found
            ),
            *(EvalSuiteInfo(name=b.name, from_=b.source, error=b.error) for b in broken),
        ]

    @api.get("/api/v1/eval/runs", operation_id="getEvalRuns", tags=["eval"], response_model=list[EvalLive])
    async def get_eval_runs(model: str | None = None, limit: int | None = None) -> list[EvalLive]:
        return [live_view(r, with_cases=False) for r in await evals.runs(model, limit)]

    @api.get("/api/v1/eval/runs/{id}", operation_id="getEvalRunsId", tags=["eval"], response_model=EvalLive)
    async def get_eval_runs_id(id: str) -> EvalLive:
        return live_view(await evals.get(id), with_cases=True)

    @api.post(
        "/api/v1/models/{name}/eval",
        operation_id="postModelsNameEval",
        tags=["models"],
        response_model=EvalLive,
        status_code=202,
    )
    async def post_models_name_eval(name: str, body: EvalRequest, draft: AuditDraft = Depends(audit_draft)) -> EvalLive:
        ask = RunAsk(
            suite=body.suite,
            content=body.content,
            file=body.file,
            concurrency=body.concurrency,
            judge=body.judge,
            min_score=body.min_score,
        )
        return live_view(await evals.start(name, ask, draft), with_cases=True)

    @api.put(
        "/api/v1/models/{name}/eval-gate",
        operation_id="putModelsNameEvalGate",
        tags=["models"],
        response_model=EvalGateView,
    )
    async def put_models_name_eval_gate(
        name: str, body: EvalGateRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> EvalGateView:
        model, gate = await evals.set_gate(name, body.suite, body.min_score, body.judge, draft)
        return EvalGateView(model=model, eval=gate)

    @api.delete(
        "/api/v1/models/{name}/eval-gate",
        operation_id="deleteModelsNameEvalGate",
        tags=["models"],
        response_model=EvalGateView,
    )
    async def delete_models_name_eval_gate(name: str, draft: AuditDraft = Depends(audit_draft)) -> EvalGateView:
        model, gate = await evals.remove_gate(name, draft)
        return EvalGateView(model=model, eval=gate)

    return api
