"""A quality run as the API shows it: whole, with its cases, while it runs (``eval.Live``), or as a job carries it
(``store.EvalRun``: how it scored, without each case). One mapping from the store's record, for both."""

from __future__ import annotations

from opod.contract.admin.models import EvalLive, StoreEvalCase, StoreEvalRun
from opod.store.evals import EvalCaseRecord, EvalRunRecord


def case_view(case: EvalCaseRecord) -> StoreEvalCase:
    return StoreEvalCase(
        id=case.case_id,
        kind=case.kind,
        weight=case.weight,
        score=case.score,
        passed=case.passed,
        answer=case.answer or None,
        detail=case.detail or None,
        error=case.error or None,
        took_ms=case.took_ms,
    )


def run_view(run: EvalRunRecord) -> StoreEvalRun:
    """How a run scored, without each case: what a job that asked it shows."""
    return StoreEvalRun(
        id=run.id,
        model=run.model,
        target=run.target or None,
        suite=run.suite,
        suite_hash=run.suite_hash or None,
        at=run.at,
        took_ms=run.took_ms,
        score=run.score,
        threshold=run.threshold,
        passed=run.passed,
        cases=run.cases,
        below=run.below,
        errors=run.errors,
        judge=run.judge or None,
        by=run.by or None,
        job=run.job or None,
        error=run.error or None,
    )


def live_view(run: EvalRunRecord, *, with_cases: bool) -> EvalLive:
    """The run as ``/api/v1/eval/runs`` shows it: its state and progress, its cases when asked; not yet passed or
    failed while it runs."""
    scored = run_view(run).model_dump(exclude_none=True)
    if run.state == "running":
        scored.pop("passed", None)
    return EvalLive(
        **scored,
        results=[case_view(c) for c in run.results] if with_cases else None,
        state=run.state,
        done=run.done,
    )
