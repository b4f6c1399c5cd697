"""Quality runs: one row per run of a suite against a model, and one per case it asked, with how it scored.

A run is written when it starts (``running``), each case as its answer is scored, and the run
again when it ends (``done``, or ``failed`` with why), so a run is readable from any leader of
the same store while it runs, and what a run asked is kept even when its leader stops midway.
``owner`` names the leader running it (its machine and home): a leader that starts again marks
the runs it left ``running`` as failed (:meth:`EvalsRepo.abandon_eval_runs`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    Row,
    Table,
    Text,
    func,
    insert,
    select,
    update,
)

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput
from opod.store.schema import UTCDateTime, metadata

RUN_STATES = ("running", "done", "failed")
"""``done``: every case asked and scored; ``failed``: the run could not be scored at all (``error`` says why)."""
LIST_MAX = 500

eval_runs = Table(
    "eval_runs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("model", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("suite", Text, nullable=False),
    Column("suite_hash", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("took_ms", BigInteger, nullable=False),
    Column("score", Double, nullable=False),
    Column("threshold", Double, nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("cases", Integer, nullable=False),
    Column("below", Integer, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("judge", Text, nullable=False),
    Column("by", Text, nullable=False),
    Column("job", Text, nullable=False),
    Column("error", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("owner", Text, nullable=False),
    Index("ix_eval_runs_model", "model"),
    Index("ix_eval_runs_at", "at"),
)

eval_cases = Table(
    "eval_cases",
    metadata,
    Column("run_id", Text, ForeignKey("eval_runs.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("case_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("weight", Double, nullable=False),
    Column("prompt", Text, nullable=False),
    Column("expected", Text, nullable=False),
    Column("answer", Text, nullable=False),
    Column("score", Double, nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("detail", Text, nullable=False),
    Column("error", Text, nullable=False),
    Column("took_ms", BigInteger, nullable=False),
    Column("request_id", Text, nullable=False),
)


def new_run_id() -> str:
    return "eval_" + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class EvalCaseRecord:
    """One case of a run: what was asked, what was expected, what came back, and its verdict."""

    seq: int
    case_id: str
    kind: str
    weight: float
    prompt: str
    expected: str
    answer: str = ""
    score: float = 0.0
    passed: bool = False
    detail: str = ""
    error: str = ""
    """Why it got no answer (the gateway's refusal, a judge that could not grade); empty when it was scored."""
    took_ms: int = 0
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class EvalRunRecord:
    id: str
    model: str
    target: str
    """The catalog model that answered, when another than ``model`` (a candidate); empty otherwise."""
    suite: str
    suite_hash: str
    source: str
    """Where the suite was read: a file, ``built in``, or what the request named."""
    at: datetime
    threshold: float
    state: str = "running"
    took_ms: int = 0
    score: float = 0.0
    passed: bool = False
    cases: int = 0
    below: int = 0
    errors: int = 0
    judge: str = ""
    by: str = ""
    job: str = ""
    error: str = ""
    owner: str = ""
    done: int = 0
    """Cases answered or failed so far (the count of its case rows)."""
    results: tuple[EvalCaseRecord, ...] = field(default=())


def _state(state: str) -> str:
    if state not in RUN_STATES:
        raise InvalidInput(f"eval run state {state!r} is not one of {', '.join(RUN_STATES)}")
    return state


def _run_values(run: EvalRunRecord) -> dict[str, Any]:
    return {
        "id": text_arg(run.id, "eval run id"),
        "model": text_arg(run.model, "eval run model"),
        "target": text_arg(run.target, "eval run target", empty=True),
        "suite": text_arg(run.suite, "eval run suite"),
        "suite_hash": text_arg(run.suite_hash, "eval run suite_hash", empty=True),
        "source": text_arg(run.source, "eval run source", empty=True),
        "at": when(run.at, "eval run at"),
        "took_ms": max(0, int(run.took_ms)),
        "score": float(run.score),
        "threshold": float(run.threshold),
        "passed": bool(run.passed),
        "cases": int(run.cases),
        "below": int(run.below),
        "errors": int(run.errors),
        "judge": text_arg(run.judge, "eval run judge", empty=True),
        "by": text_arg(run.by, "eval run by", empty=True),
        "job": text_arg(run.job, "eval run job", empty=True),
        "error": run.error,
        "state": _state(run.state),
        "owner": text_arg(run.owner, "eval run owner", empty=True),
    }


def _case_values(run_id: str, case: EvalCaseRecord) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "seq": int(case.seq),
        "case_id": text_arg(case.case_id, "eval case id"),
        "kind": text_arg(case.kind, "eval case kind"),
        "weight": float(case.weight),
        "prompt": case.prompt,
        "expected": case.expected,
        "answer": case.answer,
        "score": float(case.score),
        "passed": bool(case.passed),
        "detail": case.detail,
        "error": case.error,
        "took_ms": max(0, int(case.took_ms)),
        "request_id": text_arg(case.request_id, "eval case request_id", empty=True),
    }


def _run(row: Row[Any], done: int, results: tuple[EvalCaseRecord, ...] = ()) -> EvalRunRecord:
    m = row._mapping
    return EvalRunRecord(**{k: m[k] for k in eval_runs.c.keys()}, done=done, results=results)


def _case(row: Row[Any]) -> EvalCaseRecord:
    m = row._mapping
    return EvalCaseRecord(**{k: m[k] for k in eval_cases.c.keys() if k != "run_id"})


class EvalsRepo(Repository):
    def insert_eval_run(self, run: EvalRunRecord, *, audit: AuditRow | None = None) -> EvalRunRecord:
        """Write a run as it starts, with the audit row of the call that started it."""
        with self._write() as conn:
            conn.execute(insert(eval_runs).values(_run_values(run)))
            if audit is not None:
                insert_audit(conn, audit)
        return run

    def add_eval_case(self, run_id: str, case: EvalCaseRecord) -> None:
        """Keep one scored (or failed) case of a running run."""
        with self._write() as conn:
            conn.execute(insert(eval_cases).values(_case_values(text_arg(run_id, "eval run id"), case)))

    def finish_eval_run(self, run: EvalRunRecord) -> None:
        """Write a run's end: its score, counts, state and error."""
        values = _run_values(run)
        with self._write() as conn:
            conn.execute(update(eval_runs).where(eval_runs.c.id == values.pop("id")).values(values))

    def get_eval_run(self, run_id: str) -> EvalRunRecord | None:
        """A run with every case kept so far, in the suite's order; ``None`` when there is none."""
        with self._read() as conn:
            row = conn.execute(select(eval_runs).where(eval_runs.c.id == text_arg(run_id, "eval run id"))).first()
            if row is None:
                return None
            cases = tuple(
                _case(r)
                for r in conn.execute(
                    select(eval_cases).where(eval_cases.c.run_id == run_id).order_by(eval_cases.c.seq)
                )
            )
        return _run(row, len(cases), cases)

    def list_eval_runs(self, *, model: str = "", limit: int = 20) -> list[EvalRunRecord]:
        """Runs, newest first, without their cases (``done`` counts them); only ``model``'s when it is given."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput(f"limit: {limit!r} is not a positive whole number")
        done = select(eval_cases.c.run_id, func.count().label("done")).group_by(eval_cases.c.run_id).subquery("done")
        query = select(eval_runs, done.c.done).outerjoin(done, done.c.run_id == eval_runs.c.id)
        if model:
            query = query.where(eval_runs.c.model == model)
        query = query.order_by(eval_runs.c.at.desc(), eval_runs.c.id.desc()).limit(min(limit, LIST_MAX))
        with self._read() as conn:
            return [_run(row, row._mapping["done"] or 0) for row in conn.execute(query)]

    def abandon_eval_runs(self, owner: str, error: str) -> list[str]:
        """Mark ``owner``'s runs still ``running`` as failed with ``error`` (its leader stopped before they ended)."""
        with self._write() as conn:
            ids = [
                r.id
                for r in conn.execute(
                    select(eval_runs.c.id).where(eval_runs.c.owner == owner, eval_runs.c.state == "running")
                )
            ]
            if ids:
                conn.execute(update(eval_runs).where(eval_runs.c.id.in_(ids)).values(state="failed", error=error))
        return ids
