"""An update's or rollback's new weights started beside the old, held to quality, and taking over without a failed
request; or taken away, leaving the model as it was.

The new weights run as a model of their own, the candidate, hidden behind a canary of the model
in shadow (:class:`~opod.fleet.canaries_service.CanariesService`: clients cannot name it, copies of
live requests warm it and are counted). Taking over moves the canary's share to all of the model's
requests, lets what was already sent to the model's replicas finish (:func:`drained`), gives the model the new
weights (:meth:`~opod.fleet.models_service.ModelsService.move_weights`),
replaces its replicas in place through the reconciler's rolling restart, and only when they serve
the new weights takes the canary and the candidate away. Every change is the job's actor's, audited
as the call that started it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opod.catalog.definition import fingerprint
from opod.contract.admin.catalog import CatalogCanary, CatalogModel, CatalogOrigin, CatalogScaling
from opod.contract.admin.models import ModelserveJob
from opod.control.context import ReplicaDesk, ReplicaRecord
from opod.control.evals.service import EvalsService, Hold
from opod.control.evals.views import run_view
from opod.control.serve_steps import LiveJob, StepFailed, wait_placed, wait_started
from opod.fleet.canaries_service import SYSTEM, CanariesService
from opod.fleet.models import ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.store.audit import SOURCE_API, SOURCE_LEADER, AuditDraft
from opod.store.errors import StoreError

log = logging.getLogger("opod.updates")

MOVE_WAIT = 600.0
DRAIN = 3.0
"""Seconds a side that lost its share is left at least before its engines stop: other leaders of the store follow
the share within it, and what they sent there finishes."""
DRAIN_MAX = 600.0
"""Seconds at most a side waits for the requests this leader sent it to finish; a longer one is cut."""
POLL = 0.2
PLACED = ": the new weights, hidden from clients behind a canary in shadow"
"""The ``place`` step's words after the candidate's name: how a leader that starts again finds the candidate."""
LEFT = "its job ended with the candidate still there: the leader running it stopped"


def placed_candidate(job: ModelserveJob) -> str | None:
    """The candidate an update or rollback job placed, as its ``place`` step names it; ``None`` before that step."""
    for step in job.steps or ():
        if step.name == "place" and step.detail and step.detail.endswith(PLACED):
            return step.detail.removesuffix(PLACED)
    return None


async def drained(fleet: Fleet, model: str, least: float, say: Callable[[str], None], most: float = DRAIN_MAX) -> int:
    """Wait ``least`` seconds, then until the requests this leader sent for ``model`` finish, ``most`` seconds in all;
    how many were left unfinished. ``say`` hears how many are still running, each time that changes."""
    start = time.monotonic()
    await asyncio.sleep(least)
    said = -1
    while (left := fleet.in_flight(model)) and time.monotonic() - start < most:
        if left != said:
            say(f"{left} requests sent to {model} before the share moved are finishing")
            said = left
        await asyncio.sleep(POLL)
    return left


@dataclass(frozen=True, slots=True)
class Move:
    """Where a model's weights move: the source and origin it gets, and whether this is an update or a rollback."""

    model: str
    source: str
    origin: CatalogOrigin
    kind: str


class GateFailed(StepFailed):
    """The new weights did not pass: the reason, and the evidence the audit keeps."""

    def __init__(self, reason: str, evidence: dict[str, Any]) -> None:
        super().__init__(reason)
        self.evidence = evidence


class Takeover:
    """Carries out the candidate's part of an update or rollback job; knows the candidates it started."""

    def __init__(
        self,
        models: ModelRegistry,
        models_service: ModelsService,
        canaries: CanariesService,
        evals: EvalsService,
        fleet: Fleet,
        desk: ReplicaDesk,
        *,
        drain: float = DRAIN,
    ) -> None:
        self.models = models
        self.models_service = models_service
        self.canaries = canaries
        self.evals = evals
        self.fleet = fleet
        self.desk = desk
        self.drain = drain
        self._candidates: dict[str, str] = {}

    def is_candidate(self, name: str) -> bool:
        return name in self._candidates

    def _name(self, move: Move, job_id: str) -> str:
        # The job's own: a name an earlier job's candidate had could still be in a heartbeat that left before it went.
        base = f"{move.model}-{move.kind}-{(move.origin.revision or 'new')[:8]}-{job_id.removeprefix('sj_')[:6]}"
        name, n = base, 1
        while (taken := self.models.named(name)) is not None and not taken.removed:
            n += 1
            name = f"{base}-{n}"
        return name

    def _candidate(self, move: Move, name: str) -> CatalogModel:
        model = definition_of(self.models_service.named(move.model))
        return model.model_copy(
            update={
                "name": name,
                "aliases": None,
                "description": f"the new weights of {move.model} ({move.kind} to {(move.origin.revision or '')[:12]}), "
                "tried beside it before they take its place",
                "source": move.source,
                "origin": move.origin,
                "scaling": CatalogScaling(min=1, max=1),
                "canary": None,
                "eval": None,
                "fallbacks": None,
            }
        )

    async def carry(self, job: LiveJob, move: Move, gate: Hold, actor: str) -> None:
        """Start the candidate, hold it to the gate, take over; on any failure the candidate goes and the model is
        as it was (the failure raised for the job to say)."""

        def draft(detail: dict[str, Any] | None = None) -> AuditDraft:
            body = {"job": job.id, "kind": move.kind, **(detail or {})}
            action = f"POST /api/v1/models/{move.model}/{move.kind}"
            status = 202 if move.kind == "update" else 200  # as the call that started it answered
            return AuditDraft(actor=actor, source=SOURCE_API, action=action, status=status, body=body)

        name = self._name(move, job.id)
        self._candidates[name] = move.model
        job.mark("place", "running", name + PLACED)
        await job.save()
        withdrawn: dict[str, Any] = {}
        try:
            await self.models_service.add(self._candidate(move, name), draft())
            await self.canaries.start(move.model, CatalogCanary(model=name, percent=0), draft())
            await wait_placed(job, name, self.models, self.desk)
            job.mark("start", "running")
            await wait_started(job, name, self.fleet, self.desk)
            await self._held(job, move, name, gate, actor)
            await self._take_over(job, move, name, draft)
        except GateFailed as err:
            withdrawn = err.evidence
            raise
        finally:
            try:
                await self._withdraw(move.model, name, draft({"withdrawn": name, **withdrawn}))
            finally:
                self._candidates.pop(name, None)

    async def _held(self, job: LiveJob, move: Move, candidate: str, gate: Hold, actor: str) -> None:
        if not gate.asks:
            job.mark("eval", "skipped", gate.why)
            await job.save()
            return
        job.mark("eval", "running", f"{candidate} and {move.model} asked the same suite, case by case")
        await job.save()
        verdict = await self.evals.held(move.model, candidate, gate, job=job.id, by=actor)
        if verdict.run is not None:
            job.view.eval = run_view(verdict.run)
        found = verdict.evidence()
        said = verdict.said()
        if not verdict.passed:
            raise GateFailed(f"held back by the eval gate, {move.model} left as it was: {said}", found)
        job.mark("eval", "done", said)
        await job.save()

    async def _take_over(self, job: LiveJob, move: Move, candidate: str, draft: Any) -> None:
        job.mark("take over", "running", f"{candidate} carries all of {move.model}'s requests while it moves")
        await job.save()
        before = definition_of(self.models_service.named(move.model))
        await self.canaries.set_percent(move.model, 100, draft())
        left = await drained(self.fleet, move.model, self.drain, lambda said: job.say("take over", said))
        if left:
            log.warning("%d requests on %s's old weights ran past %.0f s and are cut", left, move.model, DRAIN_MAX)
        changed = await self.models_service.move_weights(move.model, move.source, move.origin, draft())
        try:
            await self._replaced(job, move.model, fingerprint(definition_of(changed)))
        except BaseException:
            if before.origin is not None:
                with_old = draft({"restored": before.origin.revision or ""})
                await self.models_service.move_weights(move.model, before.source or "", before.origin, with_old)
                self._restart(move.model)
            raise
        job.mark(
            "take over",
            "done",
            f"{move.model} serves {move.origin.repo}@{(move.origin.revision or '')[:12]}; {candidate} taken away",
        )

    def _restart(self, model: str) -> list[str]:
        ids = [r.id for r in self.desk.replica_list() if r.model == model and r.state in ("starting", "ready")]
        # In place, one at a time: the candidate carries the model's requests meanwhile, so no node needs room for two.
        return self.desk.queue_restart(ids, in_place=True, max_surge=0, max_unavailable=1) if ids else []

    async def _replaced(self, job: LiveJob, model: str, digest: str) -> None:
        if not self._restart(model):
            job.say("take over", f"{model} has no replica running: its next one starts with the new weights")
            return
        deadline = time.monotonic() + MOVE_WAIT
        while True:
            mine = [r for r in self.desk.replica_list() if r.model == model and r.state in ("starting", "ready")]
            new = [r for r in mine if r.fingerprint == digest]
            if new and len(new) == len(mine) and all(self._serving(r, model) for r in new):
                return
            status = self.desk.status(model)
            if status.startswith(("parked", "failed")):
                raise StepFailed(f"the new weights did not start: {status}; {model} goes back to its weights")
            if time.monotonic() > deadline:
                raise StepFailed(f"not moved within {MOVE_WAIT:.0f} s: {status}")
            job.say("take over", f"replacing {model}'s replicas: {len(new)} of {len(mine)} on the new weights")
            await job.save(throttle=True)
            await asyncio.sleep(POLL)

    def _serving(self, replica: ReplicaRecord, model: str) -> bool:
        """Whether the replica's own engine serves: its node's heartbeat names this replica and the model loaded (the
        reconciler may call an in-place replacement ready on the heartbeat of the engine it replaces)."""
        head = self.fleet.get(replica.nodes[0]) if replica.nodes else None
        held = head.replicas.get(model) if head is not None else None
        return (
            replica.state == "ready"
            and head is not None
            and held is not None
            and held.replica == replica.id
            and model in head.loaded_models
        )

    async def withdraw_left(self, jobs: list[ModelserveJob]) -> list[str]:
        """The candidates that ended update and rollback jobs among ``jobs`` left in the catalog (their leader was
        killed while they ran) taken away, as the system, saying why; the names taken."""
        taken = []
        for job in jobs:
            name = placed_candidate(job)
            ended = job.kind == "update" and job.state != "running" and job.model
            if not ended or name is None or name in self._candidates or self.models.active(name) is None:
                continue
            audit = AuditDraft(
                actor=SYSTEM,
                source=SOURCE_LEADER,
                action=f"POST /api/v1/models/{job.model}/update",
                target=f"model:{job.model}",
                body={"job": job.id, "withdrawn": name, "reason": LEFT},
            )
            await self._withdraw(job.model or "", name, audit)
            log.warning("update job %s was left unfinished: its candidate %s is taken away", job.id, name)
            taken.append(name)
        return taken

    async def _withdraw(self, model: str, candidate: str, audit: AuditDraft) -> None:
        """The canary, then the candidate, taken away; what is already gone is left alone."""
        known = self.models.active(model)
        canary = known.definition.canary if known is not None and known.definition is not None else None
        try:
            if canary is not None and canary.model == candidate:
                await self.canaries.remove(model, audit)
                if canary.percent:  # requests already drawn to the candidate (some still queued) finish there first
                    await drained(self.fleet, candidate, self.drain, lambda left: None)
            if self.models.active(candidate) is not None:
                second = AuditDraft(audit.actor, audit.source, audit.action, status=audit.status, body=audit.body)
                await self.models_service.remove(candidate, second)
        except StoreError:
            log.exception("the candidate %s of %s could not be taken away", candidate, model)
