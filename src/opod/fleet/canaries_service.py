"""The one writer of models' canaries: set, share changed, taken out, rolled back by the watcher, promoted.

A canary is kept in its model's definition (``catalog.Model.canary``), written through
:class:`~opod.fleet.models_service.ModelsService` (the store with its audit row, then memory), and
then :class:`~opod.fleet.canaries.CanaryBook` follows it, so the gateway's split changes with it.
Every change takes one lock, so the watcher's rollback and a person's change never interleave: a
rollback applies only to the very run it judged, and a canary a person changed since is judged afresh.

``promote`` makes the candidate's weights the model's, held to the model's eval gate when a
:class:`QualityGate` is given (``skip_eval`` moves without it, and the job says so). Its job, and the
job that started a canary, are kept with the serve jobs in the store (``GET /api/v1/jobs`` lists
them all), written at each step; a leader that stops mid-promotion finds it and marks it failed, as
it does every serve job.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import ModelserveCanaryView, ModelserveChange, ModelserveJob, ModelserveStep
from opod.fleet.canaries import CanaryBook, CanaryRun, Verdict, canary_problems, in_force
from opod.fleet.followers import EventSink
from opod.fleet.models import KnownModel, ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.store.audit import SOURCE_LEADER, AuditDraft, AuditRow
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync
from opod.store.serve_jobs import ServeJobsRepo

log = logging.getLogger("opod.fleet")

SYSTEM = "system"
"""The actor of the changes the leader makes by itself (a rollback)."""
JOB_KINDS = ("canary", "promote")


class GateAnswer(Protocol):
    """What an eval gate says of a candidate."""

    @property
    def passed(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    def evidence(self) -> dict[str, Any]: ...

    def said(self) -> str: ...


class HoldPlan(Protocol):
    """How a promotion is held to quality, decided before its job starts (the evaluations' ``Hold``)."""

    @property
    def asks(self) -> bool: ...

    @property
    def why(self) -> str: ...


class QualityGate(Protocol):
    """The models' eval gates (the evaluations' service): whether a candidate may take a model's place."""

    def hold_for(self, name: str, change: ModelserveChange | None, *, moved: str = "moved") -> HoldPlan: ...

    async def held(self, model: str, candidate: str, hold: Any, *, job: str = "", by: str = "opod") -> GateAnswer: ...


def _now() -> datetime:
    return datetime.now(UTC)


class CanariesService:
    def __init__(
        self,
        models_service: ModelsService,
        models: ModelRegistry,
        fleet: Fleet,
        book: CanaryBook,
        events: EventSink,
        gate: QualityGate,
        record: Callable[[AuditRow], None],
        jobs: ServeJobsRepo,
        runner: str,
    ) -> None:
        """``gate``: the models' eval gates, which a promotion is held to; ``record``: the store's audit, for the
        decisions the service takes by itself (a promotion the gate held back); ``jobs``: where jobs are kept,
        as this leader (``runner``) runs them."""
        self.models_service = models_service
        self.models = models
        self.fleet = fleet
        self.book = book
        self.events = events
        self.gate = gate
        self.record = record
        self.kept = jobs
        self.runner = runner
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        book.sync(models)

    # --- reading -------------------------------------------------------------------------------------

    def views(self) -> list[ModelserveCanaryView]:
        """Every canary as it stands, with what each side served since it was last set or changed."""
        self.book.sync(self.models)
        return [ModelserveCanaryView(model=run.model, canary=run.canary, serving=run.stat()) for run in self.book]

    async def recent_jobs(self, limit: int) -> list[ModelserveJob]:
        """The latest canary and promotion jobs, the newest first."""
        records = await run_sync(self.kept.list_serve_jobs)
        found = []
        for record in records:
            job = ModelserveJob.model_validate_json(record.job_json)
            if job.kind in JOB_KINDS:
                found.append(job)
                if len(found) == limit:
                    break
        return found

    # --- a person's changes --------------------------------------------------------------------------

    async def start(self, name: str, body: CatalogCanary, audit: AuditDraft) -> ModelserveJob:
        """Send ``body.percent`` of ``name``'s requests to the candidate ``body.model`` (0: a copy of each, in shadow)."""
        async with self._lock:
            model = self._defined(name)
            if model.definition is not None and model.definition.canary is not None:
                raise Conflict(
                    f"model {model.id!r} already has a canary ({model.definition.canary.model}); change its share "
                    f"with PUT /api/v1/models/{model.id}/canary, or take it out with DELETE first"
                )
            problems = canary_problems(body)
            if problems:
                raise InvalidInput("; ".join(problems))
            candidate = self._candidate(model, body.model or "")
            canary = body.model_copy(update={"model": candidate.id, "percent": body.percent or 0})
            await self.models_service.set_canary(model.id, canary, audit)
            self.book.sync(self.models)
            run = self.book.run_for(model.id)
        share = f"{canary.percent}% of its requests" if canary.percent else "a copy of each request, in shadow"
        limits = in_force(canary)
        return await self._new_job(
            "canary",
            model.id,
            "succeeded",
            [
                ModelserveStep(name="check", state="done", detail=f"{candidate.id} is served", at=_now()),
                ModelserveStep(
                    name="canary",
                    state="done",
                    detail=(
                        f"{candidate.id} takes {share}; rolled back by itself when, over at least "
                        f"{limits.min_requests} of its own, its error rate is {limits.max_error_increase} above "
                        f"{model.id}'s or its mean time to the first token {limits.max_ttft_ratio} times it; "
                        "GET /api/v1/canaries follows both sides"
                    ),
                    at=run.since if run is not None else _now(),
                ),
            ],
        )

    async def set_percent(self, name: str, percent: int | None, audit: AuditDraft) -> str:
        """Change the share the canary takes; its tallies start afresh."""
        if percent is None:
            raise InvalidInput("percent: required, from 0 to 100 (0 runs the candidate in shadow)")
        if not 0 <= percent <= 100:
            raise InvalidInput(f"percent: {percent} is not between 0 and 100 (0 runs the candidate in shadow)")
        async with self._lock:
            model, canary = self._with_canary(name)
            await self.models_service.set_canary(model.id, canary.model_copy(update={"percent": percent}), audit)
            self.book.sync(self.models)
        return f"canary {canary.model} of {model.id} takes {percent}% of its requests" + (
            " (in shadow: a copy of each)" if percent == 0 else ""
        )

    async def remove(self, name: str, audit: AuditDraft) -> str:
        """Take the canary out: its share first (no request goes to the candidate from now on), then the candidate."""
        async with self._lock:
            model, canary = self._with_canary(name)
            run = self.book.run_for(model.id)
            if run is not None:
                run.withdrawn = True
            try:
                await self.models_service.set_canary(model.id, None, audit)
            except BaseException:
                if run is not None:
                    run.withdrawn = False  # nothing changed: the share goes on
                raise
            finally:
                self.book.sync(self.models)
        return f"canary {canary.model} of {model.id} taken out: its share went to 0, then the candidate"

    # --- the watcher's rollback ----------------------------------------------------------------------

    async def roll_back(self, run: CanaryRun, verdict: Verdict) -> bool:
        """Take out the canary ``run`` judged, as the system, saying why; ``False`` when it is not that canary any more
        (a person changed or removed it since: the new one is judged on its own requests)."""
        async with self._lock:
            self.book.sync(self.models)
            model = self.models.active(run.model)
            current = model.definition.canary if model is not None and model.definition is not None else None
            if model is None or self.book.run_for(run.model) is not run or current is None:
                return False
            run.withdrawn = True
            detail: dict[str, Any] = {
                "candidate": run.candidate_model,
                "percent": run.percent,
                "rule": verdict.rule,
                "reason": verdict.reason,
                **verdict.numbers,
            }
            draft = AuditDraft(
                actor=SYSTEM,
                source=SOURCE_LEADER,
                action=f"DELETE /api/v1/models/{run.model}/canary",
                target=f"model:{run.model}",
                body=detail,
            )
            try:
                await self.models_service.set_canary(run.model, None, draft)
            except BaseException:
                run.withdrawn = False
                raise
            finally:
                self.book.sync(self.models)
        log.warning("canary %s of %s rolled back: %s", run.candidate_model, run.model, verdict.reason)
        self.events("canary.rolled_back", run.model, detail)
        return True

    # --- promotion -----------------------------------------------------------------------------------

    async def promote(self, name: str, change: ModelserveChange | None, audit: AuditDraft) -> ModelserveJob:
        """Make the candidate's weights the model's, after its eval gate (or without, with ``skip_eval``)."""
        model, canary = self._with_canary(name)
        candidate = self.models.active(canary.model or "")
        if candidate is None or candidate.definition is None:
            raise Conflict(
                f"the candidate {canary.model!r} is not a model added through the management API, so it has no "
                "definition whose weights could be taken; take the canary out instead"
            )
        hold = self.gate.hold_for(model.id, change, moved="promoted")  # a sent suite refused here, before any job
        job = await self._new_job("promote", model.id, "running", [])
        if not hold.asks:
            self._step(job, "eval", "skipped", hold.why)
            try:
                await self._take_over(job, model.id, candidate.id, canary, audit)
            except Exception as err:
                await self._finish(job, "failed", f"the weights could not be taken: {err}", "take over")
                raise
            return job
        task = asyncio.create_task(self._gated(job, model.id, candidate.id, canary, hold, audit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job.model_copy(deep=True)

    async def _gated(
        self, job: ModelserveJob, model: str, candidate: str, canary: CatalogCanary, hold: HoldPlan, audit: AuditDraft
    ) -> None:
        self._step(job, "eval", "running", f"{candidate} and {model} asked the same suite, case by case")
        await self._save(job)
        try:
            verdict = await self.gate.held(model, candidate, hold, job=job.id or "", by=audit.actor)
        except Exception as err:  # the gate could not run: the model is left as it was
            log.exception("the eval gate of %s could not run", model)
            await self._finish(job, "failed", f"the eval gate could not run: {err}", "eval")
            return
        if not verdict.passed:
            await self._held_back(job, model, candidate, verdict)
            return
        self._step(job, "eval", "done", verdict.said())
        try:
            await self._take_over(job, model, candidate, canary, audit)
        except (StoreError, InvalidInput) as err:
            await self._finish(job, "failed", str(err), "take over")

    async def _held_back(self, job: ModelserveJob, model: str, candidate: str, verdict: GateAnswer) -> None:
        """The gate said no: the model and its canary stay as they were, and the audit keeps why, case by case."""
        await self._finish(
            job, "failed", f"held back by the eval gate, {model} left as it was: {verdict.said()}", "eval"
        )
        held = AuditDraft(
            actor=SYSTEM,
            source=SOURCE_LEADER,
            action=f"POST /api/v1/models/{model}/promote",
            target=f"model:{model}",
            body={"candidate": candidate, "job": job.id or "", **verdict.evidence()},
        )
        try:
            await run_sync(self.record, held.after(409))
        except StoreError:
            log.exception("the eval gate's refusal to promote %s could not be audited", candidate)

    async def _take_over(
        self, job: ModelserveJob, model: str, candidate: str, canary: CatalogCanary, audit: AuditDraft
    ) -> None:
        async with self._lock:
            known = self.models.active(model)
            donor = self.models.active(candidate)
            current = known.definition.canary if known is not None and known.definition is not None else None
            if known is None or donor is None or donor.definition is None or current != canary:
                await self._finish(
                    job, "failed", f"the canary of {model} changed while it was being promoted", "take over"
                )
                return
            run = self.book.run_for(model)
            if run is not None:
                run.withdrawn = True
            try:
                await self.models_service.take_weights(model, donor.definition, audit)
            except BaseException:
                if run is not None:
                    run.withdrawn = False
                raise
            finally:
                self.book.sync(self.models)
        self._step(
            job,
            "take over",
            "done",
            f"{model} has {candidate}'s weights (its replicas are replaced beside the old ones); {candidate} "
            "stays in the catalog, clients may name it again, and it can be removed",
        )
        job.state = "succeeded"
        await self._save(job)
        self.events("canary.promoted", model, {"candidate": candidate, "job": job.id or ""})

    # --- helpers -------------------------------------------------------------------------------------

    def _defined(self, name: str) -> KnownModel:
        model = self.models_service.named(name)
        if model.definition is None:
            raise Conflict(
                f"{model.id!r} comes from the catalog file, not the management API; add it with POST /api/v1/models "
                "to give it a canary"
            )
        if self.book.candidate_of(model.id) is not None:
            raise Conflict(f"{model.id!r} is itself the candidate of {self.book.candidate_of(model.id)}'s canary")
        return model

    def _candidate(self, model: KnownModel, name: str) -> KnownModel:
        candidate = self.models.named(name)
        if candidate is None or candidate.removed:
            raise NotFound(f"model: {name!r} is not a model of the catalog; add the candidate first, then its canary")
        if candidate.id == model.id:
            raise InvalidInput("model: the candidate is another model of the catalog, not the model itself")
        taken = self.book.candidate_of(candidate.id)
        if taken is not None:
            raise Conflict(f"model: {candidate.id!r} is already the candidate of {taken}'s canary")
        if definition_of(candidate).canary is not None:
            raise Conflict(f"model: {candidate.id!r} has a canary of its own; take it out first")
        if not self.fleet.workers_for(candidate.id) and not candidate.wants_loaded():
            raise Conflict(
                f"model: the candidate {candidate.id!r} has no replica to take a share; load it first "
                f"(POST /api/v1/models/{candidate.id}/load)"
            )
        return candidate

    def _with_canary(self, name: str) -> tuple[KnownModel, CatalogCanary]:
        model = self.models_service.named(name)
        canary = model.definition.canary if model.definition is not None else None
        if canary is None:
            raise NotFound(f"model {model.id!r} has no canary; POST /api/v1/models/{model.id}/canary starts one")
        return model, canary

    async def _new_job(self, kind: str, model: str, state: str, steps: list[ModelserveStep]) -> ModelserveJob:
        job = ModelserveJob(
            id="job_" + secrets.token_hex(8), kind=kind, model=model, state=state, steps=steps, started=_now()
        )
        await run_sync(self.kept.add_serve_job, job.id or "", _json(job), runner=self.runner, at=job.started)
        if state != "running":
            await self._save(job)
        return job

    async def _save(self, job: ModelserveJob) -> None:
        try:
            await run_sync(self.kept.put_serve_job, job.id or "", job.state or "running", _json(job))
        except StoreError:
            log.exception("job %s (%s of %s) could not be kept as it moved on", job.id, job.kind, job.model)

    @staticmethod
    def _step(job: ModelserveJob, name: str, state: str, detail: str) -> None:
        steps = [s for s in job.steps or [] if s.name != name]
        job.steps = [*steps, ModelserveStep(name=name, state=state, detail=detail, at=_now())]

    async def _finish(self, job: ModelserveJob, state: str, error: str, step: str) -> None:
        self._step(job, step, state, error)
        job.state, job.error = state, error
        await self._save(job)
        log.warning("job %s (%s of %s): %s", job.id, job.kind, job.model, error)


def _json(job: ModelserveJob) -> str:
    return job.model_dump_json(exclude_none=True, by_alias=True)
