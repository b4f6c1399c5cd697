"""The one writer of quality runs, and the reader of each model's eval gate for updates and promotions.

Suites are the built-in ones and the files of the eval directory, read again at every look (a
file fixed is runnable at once; one broken is listed with why, never half-loaded). A run starts
at once and runs on in this leader (:mod:`opod.control.evals.runner`): its row and its audit row
are written together when it starts, each case as it is scored, its end when it ends. A model's
gate is part of its definition (``catalog.Model.eval``), written through
:class:`~opod.fleet.models_service.ModelsService`; :meth:`EvalsService.gate_passes` and
:meth:`EvalsService.paired` are what updates, promotions and canaries ask before they act.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opod.contract.admin.catalog import CatalogEvalGate
from opod.contract.admin.models import ModelserveChange
from opod.control.evals.builtin import built_in_suites
from opod.control.evals.compare import DEFAULT_MARGIN, Comparison, compare_runs
from opod.control.evals.runner import Ask, LiveRun, Plan, Runner
from opod.control.evals.suites import BrokenSuite, Suite, SuiteError, parse_suite, read_dir
from opod.fleet.models import KnownModel, ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService
from opod.store import Store
from opod.store.audit import AuditDraft, AuditRow
from opod.store.errors import InvalidInput, NotFound
from opod.store.evals import EvalRunRecord, new_run_id
from opod.store.offloop import run_sync

log = logging.getLogger("opod.evals")

DEFAULT_CONCURRENCY = 4
MAX_CONCURRENCY = 32
DEFAULT_LIMIT = 20
MIN_CASES = 5
"""Cases a gate's run must get answers to (or all of a smaller suite's) before its verdict counts."""
STOPPED = "the leader stopped before the run finished"
SENT = "the suite sent"


@dataclass(frozen=True, slots=True)
class RunAsk:
    """What a request asks of a run (``eval.Request``), each field as sent; ``None`` where left out."""

    suite: str | None = None
    content: str | None = None
    file: str | None = None
    concurrency: int | None = None
    judge: str | None = None
    min_score: float | None = None


CASES_SAID = 12
"""Cases a job's step names one by one; the audit row keeps every one."""


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """Whether a candidate may take a model's place, and the evidence."""

    passed: bool
    decided: bool
    """False when the evidence did not allow a verdict (too few answers, a run that failed): ``passed`` is False."""
    reason: str
    gate: CatalogEvalGate | None = None
    run: EvalRunRecord | None = None
    """The candidate's run of the gate's suite."""
    baseline: EvalRunRecord | None = None
    """The model's own run of the same suite, when it could answer."""
    comparison: Comparison | None = None

    def evidence(self) -> dict[str, Any]:
        """The verdict with its numbers and every case: the candidate's score beside the model's on the same case,
        as the audit keeps it."""
        run, baseline = self.run, self.baseline
        theirs = {c.case_id: c for c in baseline.results} if baseline is not None else {}
        threshold = (self.gate.min_score if self.gate is not None else None) or (run.threshold if run else 0.0)
        cases = []
        for case in run.results if run is not None else ():
            before = theirs.get(case.case_id)
            cases.append(
                {
                    "case": case.case_id,
                    "candidate": round(case.score, 3),
                    **({"model": round(before.score, 3)} if before is not None and not before.error else {}),
                    **({"answer": case.answer[:120]} if case.answer else {}),
                    **({"error": case.error} if case.error else {}),
                }
            )
        found: dict[str, Any] = {"passed": self.passed, "decided": self.decided, "reason": self.reason}
        if run is not None:
            found |= {"suite": run.suite, "run": run.id, "score": round(run.score, 3), "threshold": round(threshold, 3)}
            found["shortfall"] = round(max(threshold - run.score, 0.0), 3)
        if baseline is not None:
            found["model_run"], found["model_score"] = baseline.id, round(baseline.score, 3)
        if self.comparison is not None:
            found["paired"] = self.comparison.decision
            found["paired_delta"] = round(self.comparison.delta, 3)
        return found | {"cases": cases}

    def said(self) -> str:
        """The reason and the first cases, in the words of a job's step."""
        cases = self.evidence()["cases"]
        listed = [
            f"{c['case']} {c['candidate']:.2f}" + (f" (model {c['model']:.2f})" if "model" in c else "") for c in cases
        ]
        more = f", and {len(listed) - CASES_SAID} more" if len(listed) > CASES_SAID else ""
        shown = "cases: " + ", ".join(listed[:CASES_SAID]) + more if listed else ""
        return "; ".join(p for p in (self.reason, shown) if p)


@dataclass(frozen=True, slots=True)
class Hold:
    """How a change of a model's weights (an update, a promotion) is held to quality, decided before its job starts."""

    kind: str
    """``gate`` (the model's standing gate), ``sent`` (a suite sent with the change), ``skip`` (``skip_eval``, or a
    rollback) or ``none`` (no gate and no suite)."""
    why: str = ""
    """The eval step's words when nothing is asked (``skip``, ``none``)."""
    suite: Suite | None = None
    gate: CatalogEvalGate | None = None

    @property
    def asks(self) -> bool:
        return self.kind in ("gate", "sent")


def _score(value: float | None, field: str) -> float:
    if value is None:
        return 0.0
    if not 0 <= value <= 1:
        raise InvalidInput(f"{field}: {value!r} is not a score from 0 to 1 (0 takes the suite's own threshold)")
    return float(value)


class EvalsService:
    def __init__(
        self,
        store: Store,
        models: ModelRegistry,
        models_service: ModelsService,
        ask: Ask,
        *,
        eval_dir: Path,
        owner: str,
        min_cases: int = MIN_CASES,
    ) -> None:
        """``ask`` serves a ``/v1`` request as the system's own; ``owner`` names this leader in the runs it makes."""
        self.store = store
        self.models = models
        self.models_service = models_service
        self.runner = Runner(store, ask)
        self.eval_dir = eval_dir
        self.owner = owner
        self.min_cases = min_cases
        self._live: dict[str, LiveRun] = {}
        self._tasks: dict[str, asyncio.Task[EvalRunRecord]] = {}

    # --- suites -------------------------------------------------------------------------------------

    def suites(self) -> tuple[list[Suite], list[BrokenSuite]]:
        """The suites runnable by name (the built-in ones first) and the files that cannot be run, with why."""
        built_in = built_in_suites()
        found, broken = read_dir(self.eval_dir, frozenset(built_in))
        return [*built_in.values(), *found], broken

    def suite(self, name: str, field: str = "suite") -> Suite:
        """The suite called ``name``; InvalidInput naming ``field`` (and the file's own fault) otherwise."""
        found, broken = self.suites()
        for suite in found:
            if suite.name == name:
                return suite
        for bad in broken:
            if bad.name == name:
                raise SuiteError(f"{field}: {name!r} cannot be run: {bad.error}")
        names = ", ".join(s.name for s in found)
        raise InvalidInput(
            f"{field}: no suite is called {name!r}; the suites are {names} (GET /api/v1/eval/suites), or send one's "
            f"text in content"
        )

    def _sent(self, ask: RunAsk) -> Suite:
        if ask.suite and ask.content:
            raise InvalidInput("suite, content: name a suite or send one's text, not both")
        if ask.content:
            source = ask.file or SENT
            return parse_suite(ask.content, source, Path(ask.file).stem if ask.file else "sent")
        if ask.file:
            raise InvalidInput("file: names the file content was read from; send the suite's text in content too")
        if not ask.suite:
            raise InvalidInput("suite: name a suite (GET /api/v1/eval/suites lists them) or send one's text in content")
        return self.suite(ask.suite)

    # --- models -------------------------------------------------------------------------------------

    def _model(self, name: str, field: str = "") -> KnownModel:
        model = self.models.named(name)
        if model is not None:
            return model
        where = f"{field}: " if field else "model "
        message = f"{where}{name!r} is not in the catalog; GET /api/v1/models lists the models"
        raise InvalidInput(message) if field else NotFound(message)

    def _judge(self, suite: Suite, *asked: str | None) -> str:
        named = next((j for j in asked if j), "") or suite.judge
        if named:
            return self._model(named, "judge").id
        if suite.judged:
            raise InvalidInput(
                f"judge: suite {suite.name} has cases graded by a judge model (rubric) and names none; name one in judge"
            )
        return ""

    # --- runs ---------------------------------------------------------------------------------------

    async def start(self, name: str, ask: RunAsk, audit: AuditDraft) -> EvalRunRecord:
        """Start a run of a suite against the model called ``name``; answers it as it starts (202)."""
        model = self._model(name)
        suite = self._sent(ask)
        concurrency = ask.concurrency or DEFAULT_CONCURRENCY
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise InvalidInput(f"concurrency: {ask.concurrency} cases at once; give 1 to {MAX_CONCURRENCY}")
        plan = Plan(
            suite=suite,
            model=model.id,
            target=model.id,
            threshold=_score(ask.min_score, "min_score") or suite.threshold,
            judge=self._judge(suite, ask.judge),
            concurrency=concurrency,
            by=audit.actor,
        )
        detail = {"suite": suite.name, "suite_hash": suite.hash, "from": suite.source, "threshold": plan.threshold}
        with audit.commit(target=f"model:{model.id}", detail=detail) as row:
            live = await self._begin(plan, audit=row)
        return live.view()

    async def _begin(self, plan: Plan, audit: AuditRow | None = None) -> LiveRun:
        record = EvalRunRecord(
            id=new_run_id(),
            model=plan.model,
            target=plan.target if plan.target != plan.model else "",
            suite=plan.suite.name,
            suite_hash=plan.suite.hash,
            source=plan.suite.source,
            at=datetime.now(UTC),
            threshold=plan.threshold,
            cases=len(plan.suite.cases),
            judge=plan.judge,
            by=plan.by,
            job=plan.job,
            owner=self.owner,
        )
        await run_sync(self.store.insert_eval_run, record, audit=audit)
        live = LiveRun(record)
        self._live[record.id] = live
        task = asyncio.create_task(self.runner.execute(plan, live), name=f"quality run {record.id}")
        self._tasks[record.id] = task
        task.add_done_callback(lambda _: self._forget(record.id))
        return live

    def _forget(self, run_id: str) -> None:
        self._tasks.pop(run_id, None)
        self._live.pop(run_id, None)

    async def get(self, run_id: str) -> EvalRunRecord:
        """A run with each case: as it stands while it runs here, else as the store keeps it."""
        live = self._live.get(run_id)
        if live is not None:
            return live.view()
        found = await run_sync(self.store.get_eval_run, run_id)
        if found is None:
            raise NotFound(f"quality run {run_id!r} is not known; GET /api/v1/eval/runs lists them")
        return found

    async def runs(self, model: str | None, limit: int | None) -> list[EvalRunRecord]:
        """Runs, newest first (those running here as they stand), without their cases."""
        if limit is not None and limit < 1:
            raise InvalidInput(f"limit: {limit} is not a positive number of runs")
        if model and "\x00" in model:
            raise InvalidInput("model: contains a NUL character; name a model of the catalog")
        kept = await run_sync(self.store.list_eval_runs, model=model or "", limit=limit or DEFAULT_LIMIT)
        out = []
        for record in kept:
            live = self._live.get(record.id)
            out.append(live.view() if live is not None else record)
        return out

    async def wait(self, run_id: str) -> EvalRunRecord:
        """The run once it ended, with its cases."""
        task = self._tasks.get(run_id)
        if task is not None:
            return await asyncio.shield(task)
        return await self.get(run_id)

    async def run_to_end(self, plan: Plan) -> EvalRunRecord:
        """Make a run and wait for its end (a gate's, a comparison's)."""
        live = await self._begin(plan)
        return await self.wait(live.record.id)

    # --- comparisons and gates ---------------------------------------------------------------------

    async def paired(
        self,
        model: str,
        candidate: str,
        suite: str,
        *,
        judge: str = "",
        min_pairs: int | None = None,
        margin: float = DEFAULT_MARGIN,
        by: str = "opod",
        job: str = "",
    ) -> tuple[Comparison, EvalRunRecord, EvalRunRecord]:
        """Ask ``model`` and ``candidate`` the same suite at once and compare them case by case:
        (comparison, the model's run, the candidate's run)."""
        return await self._paired(model, candidate, self.suite(suite), judge, min_pairs, margin, by, job)

    async def _paired(
        self,
        model: str,
        candidate: str,
        chosen: Suite,
        judge: str,
        min_pairs: int | None,
        margin: float,
        by: str,
        job: str,
    ) -> tuple[Comparison, EvalRunRecord, EvalRunRecord]:
        known, other = self._model(model), self._model(candidate, "candidate")
        base = Plan(
            chosen, known.id, known.id, chosen.threshold, self._judge(chosen, judge), DEFAULT_CONCURRENCY, by, job
        )
        cand = Plan(chosen, known.id, other.id, base.threshold, base.judge, DEFAULT_CONCURRENCY, by, job)
        baseline, run = await asyncio.gather(self.run_to_end(base), self.run_to_end(cand))
        need = min_pairs if min_pairs is not None else min(self.min_cases, len(chosen.cases))
        return compare_runs(baseline, run, min_pairs=need, margin=margin), baseline, run

    def gate(self, name: str) -> tuple[str, CatalogEvalGate | None]:
        """(the model's id, its standing gate or ``None``)."""
        model = self._model(name)
        return model.id, definition_of(model).eval

    async def set_gate(
        self, name: str, suite: str | None, min_score: float | None, judge: str | None, audit: AuditDraft
    ) -> tuple[str, CatalogEvalGate | None]:
        """Hold the model's updates and promotions to ``suite``; an empty suite takes the gate away."""
        model = self._model(name)
        if not suite:
            return await self.remove_gate(name, audit)
        chosen = self.suite(suite)
        gate = CatalogEvalGate(suite=chosen.name, min_score=_score(min_score, "min_score") or None, judge=None)
        if judge or chosen.judged:
            gate = gate.model_copy(update={"judge": self._judge(chosen, judge) or None})
        changed = await self.models_service.set_eval_gate(model.id, gate, audit)
        return changed.id, gate

    async def remove_gate(self, name: str, audit: AuditDraft) -> tuple[str, CatalogEvalGate | None]:
        model = self._model(name)
        changed = await self.models_service.set_eval_gate(model.id, None, audit)
        return changed.id, None

    async def gate_passes(self, model: str, candidate: str, *, job: str = "", by: str = "opod") -> GateVerdict:
        """Whether ``candidate`` (the new weights, a canary) passes ``model``'s eval gate.

        The candidate's run must finish, get answers to at least the gate's minimum of cases, and reach
        the gate's score (the suite's threshold when it sets none); when ``model`` answers the same
        suite, the paired comparison must not find the candidate worse. A model without a gate passes.
        """
        model_id, gate = self.gate(model)
        if gate is None or not gate.suite:
            return GateVerdict(True, True, f"model {model_id} has no eval gate")
        try:
            chosen = self.suite(gate.suite)
        except InvalidInput as err:
            return GateVerdict(False, False, f"the gate's suite cannot be run: {err}", gate)
        return await self._held_to(model_id, candidate, chosen, gate, job=job, by=by)

    def sent_gate(self, ask: RunAsk) -> tuple[Suite, CatalogEvalGate]:
        """The suite a request sends to hold new weights to (an update's ``eval``), checked whole before anything
        starts, as a gate; ``InvalidInput`` naming the field otherwise."""
        chosen = self._sent(ask)
        gate = CatalogEvalGate(suite=chosen.name, min_score=_score(ask.min_score, "eval.min_score") or None)
        if ask.judge or chosen.judged:
            gate = gate.model_copy(update={"judge": self._judge(chosen, ask.judge) or None})
        return chosen, gate

    async def suite_passes(
        self, model: str, candidate: str, chosen: Suite, gate: CatalogEvalGate, *, job: str = "", by: str = "opod"
    ) -> GateVerdict:
        """Whether ``candidate`` passes ``chosen`` (a suite sent with the change) as :meth:`gate_passes` holds it."""
        return await self._held_to(self._model(model).id, candidate, chosen, gate, job=job, by=by)

    def hold_for(self, name: str, change: ModelserveChange | None, *, moved: str = "moved") -> Hold:
        """How ``change`` holds new weights for ``name`` to quality; a sent suite is checked whole here, before any
        job, and refused with ``InvalidInput`` naming its field. ``moved``: the change's word in the step's reason."""
        change = change or ModelserveChange()
        model = self._model(name)
        if change.skip_eval and change.eval is not None:
            raise InvalidInput("eval, skip_eval: send a suite to hold the new weights to, or skip_eval, not both")
        if change.skip_eval:
            return Hold("skip", f"skipped, as asked (skip_eval): {moved} without the model's eval gate")
        if change.eval is not None:
            sent = change.eval
            ask = RunAsk(sent.suite, sent.content, sent.file, sent.concurrency, sent.judge, sent.min_score)
            try:
                chosen, gate = self.sent_gate(ask)
            except InvalidInput as err:
                raise InvalidInput(f"eval.{err}") from None
            return Hold("sent", suite=chosen, gate=gate)
        standing = definition_of(model).eval
        if standing is not None and standing.suite:
            return Hold("gate", gate=standing)
        return Hold("none", f"skipped: {model.id} has no eval gate and the change sent no suite")

    async def held(self, model: str, candidate: str, hold: Hold, *, job: str = "", by: str = "opod") -> GateVerdict:
        """Whether ``candidate`` passes what ``hold`` asks (one that asks nothing passes, saying why)."""
        if hold.kind == "sent" and hold.suite is not None and hold.gate is not None:
            return await self.suite_passes(model, candidate, hold.suite, hold.gate, job=job, by=by)
        if hold.kind == "gate":
            return await self.gate_passes(model, candidate, job=job, by=by)
        return GateVerdict(True, True, hold.why)

    async def _held_to(
        self, model_id: str, candidate: str, chosen: Suite, gate: CatalogEvalGate, *, job: str, by: str
    ) -> GateVerdict:
        comparison, baseline, run = await self._paired(
            model_id, candidate, chosen, gate.judge or "", None, DEFAULT_MARGIN, by, job
        )
        threshold = gate.min_score or chosen.threshold
        need = min(self.min_cases, len(chosen.cases))
        answered = run.cases - run.errors

        def verdict(passed: bool, decided: bool, reason: str) -> GateVerdict:
            kept = baseline if baseline.state == "done" else None
            return GateVerdict(passed, decided, reason, gate, run, kept, comparison if decided else None)

        if run.state != "done":
            return verdict(False, False, f"the candidate's run {run.id} did not finish: {run.error}")
        if answered < need:
            return verdict(
                False, False, f"the candidate answered {answered} of {run.cases} cases; the gate needs {need} to decide"
            )
        score = f"score {run.score:.3f} against {threshold:.3f} on suite {chosen.name} (run {run.id})"
        if run.score < threshold:
            return verdict(False, True, f"below the gate by {threshold - run.score:.3f}: {score}")
        if comparison.decision == "worse":
            return verdict(False, True, f"worse than {model_id} on the same cases: {comparison.reason}")
        return verdict(True, True, f"passed: {score}; against {model_id}: {comparison.decision} ({comparison.reason})")

    # --- the lifespan -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Mark the runs this leader left unfinished when it last stopped, then, at ``stop``, end those running."""
        left = await run_sync(self.store.abandon_eval_runs, self.owner, STOPPED)
        if left:
            log.warning("%d quality runs were left unfinished when this leader stopped: %s", len(left), ", ".join(left))
        try:
            await stop.wait()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await run_sync(self.store.abandon_eval_runs, self.owner, STOPPED)
