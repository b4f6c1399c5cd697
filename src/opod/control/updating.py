"""Updates and rollbacks of served models: ``/updates``, ``/updates/check``, ``/models/{name}/update|rollback|origin``.

An update moves a model to its repository's latest commit without a failed request, held to
quality: the new weights are fetched (the Hub client, resumable and digest-checked, into the
commit's own folder), start beside the old as a hidden candidate (the canaries' mechanism: a
canary in shadow, which clients cannot name), and are asked the model's eval gate, or the suite
the change sends, paired case by case with the model itself
(:meth:`~opod.control.evals.service.EvalsService.gate_passes`). A gate that fails takes the
candidate away and leaves the model as it was; the job and the audit row say by how much, case by
case. One that passes takes over (:mod:`opod.control.update_steps`): the candidate carries all the
model's requests while the model's replicas are replaced with the new weights, then the candidate
goes. A rollback is the same move back to the commit the last update replaced, which the model's
origin keeps, without a gate: a person's decision.

The job is a serve job (``kind: update``), kept by :class:`~opod.control.serving.ServeJobs`.
What the registry was last found to have is kept in the store (``store.update_checks``), so every
leader lists the same until the next check.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from opod.contract.admin.catalog import CatalogOrigin
from opod.contract.admin.models import (
    ModelserveChange,
    ModelserveJob,
    ModelserveStep,
    ModelserveUpdateInfo,
    OriginView,
)
from opod.control.evals.service import EvalsService, Hold
from opod.control.serve_steps import Fetch, LiveJob, fetch
from opod.control.serving import ServeJobs
from opod.control.update_checks import Latest, back, compare, found_origin, moved, read_latest, unchecked
from opod.control.update_steps import Move, Takeover
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.offloop import run_sync
from opod.weights.errors import WeightsError
from opod.weights.hub import HubSettings, check_repo

log = logging.getLogger("opod.updates")

UPDATE = "update"
STEPS = ("check", "fetch", "place", "start", "eval", "take over")


def _now() -> datetime:
    return datetime.now(UTC)


def _read(text: str | None) -> ModelserveUpdateInfo | None:
    if text is None:
        return None
    try:
        return ModelserveUpdateInfo.model_validate_json(text)
    except ValidationError:
        return None  # kept by another version of opod: shown as not checked until the next check


def _why(err: WeightsError) -> str:
    return f"the registry could not be asked: {err}"


class Updates:
    """Finds newer weights for served models and moves models to them, or back; the jobs are ``ServeJobs``'."""

    def __init__(
        self,
        models: ModelRegistry,
        models_service: ModelsService,
        jobs: ServeJobs,
        evals: EvalsService,
        takeover: Takeover,
        store: Store,
        *,
        hub: HubSettings,
    ) -> None:
        self.models = models
        self.store = store
        self.models_service = models_service
        self.jobs = jobs
        self.evals = evals
        self.takeover = takeover
        self.hub = hub
        self._moving: set[str] = set()
        """Models an update or rollback of this leader is moving now."""

    async def run(self, stop: asyncio.Event) -> None:
        """Take away the candidates that ended updates left in the catalog (a leader killed while one ran), then
        wait for ``stop``."""
        await self.takeover.withdraw_left(await self.jobs.jobs())
        await stop.wait()

    # --- what the registry has ----------------------------------------------------------------------------

    def _with_origin(self) -> list[tuple[KnownModel, CatalogOrigin]]:
        out = []
        for model in sorted(self.models, key=lambda m: m.id):
            definition = model.definition
            if model.removed or definition is None or definition.origin is None or not definition.origin.repo:
                continue
            if self.takeover.is_candidate(model.id):
                continue
            out.append((model, definition.origin))
        return out

    async def infos(self) -> list[ModelserveUpdateInfo]:
        """Every model with an origin, as last checked (one never checked, or checked at other weights, says only what
        it runs)."""
        kept = await run_sync(self.store.update_checks)
        out = []
        for model, origin in self._with_origin():
            seen = _read(kept.get(model.id))
            if seen is not None and seen.current == (origin.revision or None) and seen.repo == origin.repo:
                out.append(seen)
                continue
            out.append(
                ModelserveUpdateInfo(
                    model=model.id,
                    repo=origin.repo,
                    current=origin.revision or None,
                    previous=origin.previous.revision if origin.previous and origin.previous.revision else None,
                )
            )
        return out

    async def check(self, name: str | None) -> list[ModelserveUpdateInfo]:
        """Ask the registry now about the model called ``name``, or every model with an origin when none is named."""
        chosen = self._with_origin()
        if name:
            model = self.models_service.named(name)
            if model.definition is None or model.definition.origin is None or not model.definition.origin.repo:
                raise InvalidInput(
                    f"model: {model.id!r} has no origin to compare; POST /api/v1/models/{model.id}/origin names the "
                    "repository its weights came from"
                )
            chosen = [(model, model.definition.origin)]
        latest: dict[str, Latest | str] = {}
        out = []
        for model, origin in chosen:
            repo = origin.repo or ""
            if repo not in latest:
                try:
                    latest[repo] = await read_latest(self.hub, repo)
                except WeightsError as err:
                    latest[repo] = _why(err)
            found = latest[repo]
            info = compare(model.id, origin, found, _now()) if isinstance(found, Latest) else None
            info = info or unchecked(model.id, origin, _now(), str(found))
            await self._keep(info)
            out.append(info)
        return out

    async def _keep(self, info: ModelserveUpdateInfo) -> None:
        body = info.model_dump_json(exclude_none=True, by_alias=True)
        await run_sync(self.store.put_update_check, info.model or "", body, at=info.checked_at)

    # --- moving a model -----------------------------------------------------------------------------------

    def _movable(self, name: str) -> tuple[KnownModel, CatalogOrigin]:
        model = self.models_service.named(name)
        definition = model.definition
        if definition is None:
            raise Conflict(
                f"{model.id!r} comes from the catalog file, not the management API, so it has no origin to update "
                "from; serve it from the registry (POST /api/v1/models/serve) instead"
            )
        if definition.origin is None or not definition.origin.repo or not definition.origin.files:
            raise Conflict(
                f"model {model.id!r} has no origin with files; POST /api/v1/models/{model.id}/origin names the "
                "repository its weights came from"
            )
        if self.takeover.is_candidate(model.id):
            raise Conflict(f"{model.id!r} is the new weights of another model's update; update that model instead")
        if model.id in self._moving:
            raise Conflict(f"model {model.id!r} is being moved by a job already; GET /api/v1/jobs says where it stands")
        if definition.canary is not None:
            raise Conflict(
                f"model {model.id!r} has a canary ({definition.canary.model}) running; promote it or take it out "
                f"(DELETE /api/v1/models/{model.id}/canary) before moving its weights"
            )
        return model, definition.origin

    async def update(self, name: str, change: ModelserveChange | None, audit: AuditDraft) -> ModelserveJob:
        """Start moving the model to its repository's latest commit (202); refused, with no job, when there is none."""
        change = change or ModelserveChange()
        model, origin = self._movable(name)
        gate = self.evals.hold_for(model.id, change)
        try:
            latest = await read_latest(self.hub, origin.repo or "")
        except WeightsError as err:
            raise Conflict(f"repo: {_why(err)}") from None
        info = compare(model.id, origin, latest, _now())
        await self._keep(info)
        if not info.available:
            why = info.error or f"{model.id} already runs the files of {latest.revision[:12]}, the latest commit"
            raise Conflict(f"model {model.id!r} has no update: {why}")
        source, new_origin, artifact = moved(origin, model.definition.source or "" if model.definition else "", latest)
        checked = (
            f"{origin.repo}: {(origin.revision or 'unknown')[:12]} → {latest.revision[:12]}; "
            f"{', '.join(info.changed or [])} changed, {info.bytes} bytes to fetch"
        )
        move = Move(model.id, source, new_origin, kind=UPDATE)
        return await self._start(move, artifact, checked, gate, audit, {"to": latest.revision})

    async def rollback(self, name: str, audit: AuditDraft) -> str:
        """Start moving the model back to the weights its last update replaced; what it started, in words."""
        model, origin = self._movable(name)
        previous = origin.previous
        if previous is None or not previous.revision or not previous.files:
            raise Conflict(f"model {model.id!r} has no previous weights to go back to: it was never updated")
        source, new_origin, artifact = back(origin, model.definition.source or "" if model.definition else "")
        checked = f"{origin.repo}: back from {(origin.revision or '')[:12]} to {previous.revision[:12]}"
        gate = Hold("skip", "skipped: a rollback returns to weights that served before, as a person decided")
        move = Move(model.id, source, new_origin, kind="rollback")
        job = await self._start(move, artifact, checked, gate, audit, {"to": previous.revision})
        return (
            f"rolling {model.id} back to {previous.revision[:12]}: its replicas are replaced beside the running ones; "
            f"job {job.id} (GET /api/v1/jobs/{job.id})"
        )

    async def _start(
        self,
        move: Move,
        artifact: Any,
        checked: str,
        gate: Hold,
        audit: AuditDraft,
        detail: dict[str, Any],
    ) -> ModelserveJob:
        now = _now()
        steps = [ModelserveStep(name=name, state="waiting") for name in STEPS]
        steps[0] = ModelserveStep(name="check", state="done", detail=checked, at=now)
        view = ModelserveJob(kind=UPDATE, state="running", model=move.model, steps=steps, started=now)
        what = Fetch(move.origin.repo or "", move.origin.revision or "", artifact, self.jobs.weights_dir)

        async def work(job: LiveJob) -> None:
            try:
                await fetch(job, what, self.hub)
                await self.takeover.carry(job, move, gate, audit.actor)
            finally:
                self._moving.discard(move.model)

        detail = {"model": move.model, "repo": move.origin.repo, "kind": move.kind, **detail}
        self._moving.add(move.model)
        try:
            return await self.jobs.begin(view, audit, f"model:{move.model}", detail, work)
        except BaseException:
            self._moving.discard(move.model)
            raise

    # --- origins ------------------------------------------------------------------------------------------

    async def set_origin(self, name: str, repo: str | None, audit: AuditDraft) -> OriginView:
        """Record the repository a model's weights (added by hand) came from, found in it by digest or name."""
        if not repo:
            raise InvalidInput("repo: required; the registry repository the weights came from, as owner/name")
        try:
            check_repo(repo)
        except WeightsError as err:
            raise InvalidInput(str(err)) from None
        model = self.models_service.named(name)
        if model.definition is None:
            raise Conflict(
                f"{model.id!r} comes from the catalog file, not the management API; add it with POST /api/v1/models "
                "to record its origin"
            )
        try:
            latest = await read_latest(self.hub, repo)
        except WeightsError as err:
            raise NotFound(f"repo: {_why(err)}") from None
        try:
            origin = found_origin(repo, model.definition.source or "", latest)
        except ValueError as err:
            raise InvalidInput(str(err)) from None
        before = model.definition.origin
        if before is not None and before.repo == repo and before.previous is not None:
            origin = origin.model_copy(update={"previous": before.previous})
        await self.models_service.set_origin(model.id, origin, audit)
        return OriginView(
            repo=origin.repo,
            revision=origin.revision or None,
            previous=origin.previous.revision if origin.previous is not None and origin.previous.revision else None,
        )
