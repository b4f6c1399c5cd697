"""Registry plans and serve jobs: the service behind ``/plan``, ``/models/serve`` and ``/jobs``.

A plan reads the repository from the Hub (:mod:`opod.weights.registry`) and asks
:mod:`opod.fleet.serve_plan` every way it runs on the fleet as it is now. Serving checks the
whole request and resolves it to one way before anything starts, so bad input (a repository
that does not exist or is gated, no file of the format, a name taken, a context no node holds)
is refused with its status and no job; then the job is kept (with the call's audit row) and its
steps run in a task of their own (:mod:`opod.control.serve_steps`). The served model is an
ordinary model afterwards, added through :class:`~opod.fleet.models_service.ModelsService`, its
``origin`` the repository, commit and files it came from.

Jobs are the store's: a leader that starts again marks those it was running failed, with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opod.catalog.definition import class_problem, derived_name
from opod.contract.admin.catalog import (
    CatalogCapabilities,
    CatalogGuardModel,
    CatalogModel,
    CatalogOrigin,
    CatalogOriginFile,
    CatalogScaling,
)
from opod.contract.admin.models import ModelserveJob, ModelservePlan, ModelserveRequest
from opod.control.context import ControlError, Replayer, ReplicaDesk
from opod.control.holding import held_now
from opod.control.serve_steps import (
    EVAL_SKIPPED,
    Fetch,
    LiveJob,
    StepFailed,
    fetch,
    new_steps,
    smoke_test,
    wait_placed,
    wait_started,
)
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.serve_plan import DEFAULT_CONTEXT, ENGINE_WORDS, Way, plan, why_none
from opod.fleet.state import Fleet
from opod.store import Store
from opod.store.audit import SOURCE_API, AuditDraft
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync
from opod.store.serve_jobs import RUNNING, new_serve_job_id
from opod.weights.errors import WeightsError
from opod.weights.hub import HubClient, HubError, HubSettings, check_repo
from opod.weights.registry import FORMATS, Artifact, Repository, read_repository

log = logging.getLogger("opod.serve")

MOST_CONTEXT = 10_000_000
GUARD_FORMATS = ("llamaguard3", "qwen3guard", "shieldgemma", "json")
RESTARTED = "the leader stopped while this job ran; serve again to finish it"


def _repo_error(err: WeightsError) -> Exception:
    """A Hub refusal as the API's: missing → 404, gated or refused → 403, the Hub unreachable or failing → 502."""
    if isinstance(err, HubError) and (err.code == "GatedRepo" or err.status == 403):
        return Forbidden(f"repo: {err}")
    if isinstance(err, HubError) and err.status in (401, 404):
        return NotFound(f"repo: {err}")
    return ControlError(502, f"repo: {err}")


def _format(asked: str | None, file: str | None = None) -> str:
    if asked is None or asked == "":
        return "safetensors" if file and file.endswith(".safetensors") else "gguf"
    if asked not in FORMATS:
        raise InvalidInput(
            f"format: {asked!r} is not one opod serves; use gguf (llama.cpp) or safetensors (vLLM, SGLang)"
        )
    return asked


class ServeJobs:
    """Plans, starts and keeps serve jobs; the one writer of the ``serve_jobs`` rows."""

    def __init__(
        self,
        store: Store,
        models: ModelRegistry,
        models_service: ModelsService,
        fleet: Fleet,
        desk: ReplicaDesk,
        asker: Replayer,
        *,
        hub: HubSettings,
        weights_dir: Path,
        runner: str,
    ) -> None:
        """``weights_dir``: where fetched files go (``<home>/models/hf``); ``runner``: this leader, as its jobs name it."""
        self.store = store
        self.models = models
        self.models_service = models_service
        self.fleet = fleet
        self.desk = desk
        self.asker = asker
        self.hub = hub
        self.weights_dir = weights_dir
        self.runner = runner
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._live: dict[str, LiveJob] = {}

    # --- plans ------------------------------------------------------------------------------------------

    async def _repository(self, repo: str | None, format: str) -> Repository:
        if not repo:
            raise InvalidInput(
                "repo: required; the registry repository as owner/name, such as bartowski/Qwen2.5-0.5B-GGUF"
            )
        try:
            check_repo(repo)
            async with HubClient(self.hub) as client:
                return await read_repository(client, repo, format)
        except WeightsError as err:
            if not isinstance(err, HubError) and str(err).startswith("repo:"):
                raise InvalidInput(str(err)) from None
            raise _repo_error(err) from None

    def _plan(self, repository: Repository, format: str, context: int) -> tuple[ModelservePlan, list[Way]]:
        held = held_now(self.models, self.fleet, self.desk)
        return plan(repository, format, context, list(self.fleet), held, now=time.monotonic())

    async def plan(self, repo: str | None, format: str | None, context: int | None) -> ModelservePlan:
        """Every way ``repo`` runs here at ``context`` tokens, best first; a gated one the Hub refuses is said so."""
        chosen = _format(format)
        if context is not None and not 1 <= context <= MOST_CONTEXT:
            raise InvalidInput(f"context: {context} tokens; ask for 1 to {MOST_CONTEXT} (left out: {DEFAULT_CONTEXT})")
        tokens = context or DEFAULT_CONTEXT
        try:
            repository = await self._repository(repo, chosen)
        except Forbidden as err:
            reason = str(err).removeprefix("repo: ")
            return ModelservePlan(repo=repo, format=chosen, context=tokens, gated=True, servable=False, reason=reason)
        return self._plan(repository, chosen, tokens)[0]

    # --- starting a job ---------------------------------------------------------------------------------

    def _checked(self, request: ModelserveRequest) -> None:
        problems = [p for p in [class_problem(request.class_)] if p]
        for field in ("gpus_per_node", "tp", "nodes", "ctx_pool", "context_length", "cpu_cores"):
            value = getattr(request, field)
            if value is not None and value < (0 if field == "cpu_cores" else 1):
                problems.append(f"{field}: {value} is below {0 if field == 'cpu_cores' else 1}")
        if request.replicas is not None and request.replicas < 0:
            problems.append(f"replicas: {request.replicas} is below 0 (0 loads it on demand)")
        if request.nodes is not None and request.nodes > 1:
            problems.append(
                "nodes: a replica across nodes is not planned by serve; add the model with profiles instead"
            )
        if request.guard_format and request.guard_format not in GUARD_FORMATS:
            problems.append(f"guard_format: {request.guard_format!r} is not one of {', '.join(GUARD_FORMATS)}")
        if request.projector:
            problems.append(
                "projector: opod's workers do not load vision projectors yet; leave it out to serve text alone"
            )
        if request.cpu and (request.gpu_class or request.gpus_per_node or request.tp):
            problems.append("cpu: true runs it without GPUs; leave out gpu_class, gpus_per_node and tp, or cpu")
        if problems:
            raise InvalidInput("; ".join(problems))

    @staticmethod
    def _artifact(repository: Repository, request: ModelserveRequest, format: str) -> Artifact:
        mine = repository.of_format(format)
        if not mine:
            raise InvalidInput(why_none(repository, format, 1, []))
        if request.file:
            found = next((a for a in mine if request.file in (a.name, *(f.path for f in a.files))), None)
            if found is None:
                names = ", ".join(a.name for a in mine)
                raise InvalidInput(
                    f"file: {request.file!r} is not a {format} file of {repository.repo}; it has {names}"
                )
            return found
        if format == "safetensors":
            return mine[0]
        wanted = (request.quant or "Q4_K_M").upper()
        found = next((a for a in mine if a.quant.upper() == wanted), None)
        if found is None and request.quant:
            quants = ", ".join(sorted({a.quant or a.name for a in mine}))
            raise InvalidInput(f"quant: {repository.repo} has no {request.quant} file; it has {quants}")
        return found or min(mine, key=lambda a: a.bytes)

    def _ways(self, repository: Repository, artifact: Artifact, request: ModelserveRequest, context: int) -> list[Way]:
        view, ways = self._plan(repository, artifact.format, context)
        mine = [w for w in ways if w.artifact.name == artifact.name]
        cards = request.gpus_per_node or request.tp
        fitting = [
            w
            for w in mine
            if (request.cpu is None or bool(w.option.cpu) == request.cpu)
            and (not request.gpu_class or w.option.gpu_class == request.gpu_class)
            and (not cards or (w.option.gpus_per_node or 0) >= cards)
        ]
        if fitting:
            return fitting
        if not mine:
            best = next((a.best for a in view.artifacts or [] if a.best is not None), None)
            other = f"; {best.artifact} fits ({'CPU' if best.cpu else best.gpu_class})" if best is not None else ""
            reason = view.reason or f"{artifact.name} fits on no node at {context} tokens{other}"
            raise InvalidInput(f"context: {reason}" if not reason.startswith(("context", "format")) else reason)
        asked = ", ".join(
            f"{k}={v}"
            for k, v in (("cpu", request.cpu), ("gpu_class", request.gpu_class), ("gpus_per_node", cards))
            if v
        )
        where = ", ".join("CPU" if w.option.cpu else f"{w.option.gpus_per_node}× {w.option.gpu_class}" for w in mine)
        raise InvalidInput(f"{asked}: {artifact.name} does not run that way here; it runs on {where}")

    def _definition(
        self, name: str, request: ModelserveRequest, repository: Repository, artifact: Artifact, ways: list[Way]
    ) -> CatalogModel:
        chosen = ways if request.fallbacks else ways[:1]
        profiles = [w.profile.model_copy(update={"cpu_cores": request.cpu_cores or None}) for w in chosen]
        replicas = 1 if request.replicas is None else request.replicas
        source = repository.repo + (f"/{artifact.files[0].path}" if artifact.format == "gguf" else "")
        caps = CatalogCapabilities(tools=request.tools, embeddings=request.embeddings)
        files = [CatalogOriginFile(path=f.path, sha256=f.sha256, bytes=f.size) for f in artifact.files]
        return CatalogModel(
            name=name,
            aliases=request.aliases,
            description=request.description
            or f"{repository.repo} ({artifact.quant or artifact.name}), served from the registry",
            source=source,
            profiles=profiles,
            scaling=CatalogScaling(min=replicas, max=max(replicas, 1)),
            class_=request.class_ or None,
            context_length=request.context_length,
            capabilities=caps if request.tools or request.embeddings else None,
            role="guard" if request.guard_format else None,
            guard=CatalogGuardModel(format=request.guard_format) if request.guard_format else None,
            origin=CatalogOrigin(repo=repository.repo, revision=repository.revision, files=files),
        )

    def _free_name(self, request: ModelserveRequest, repository: Repository) -> str:
        name = request.name or derived_name(repository.repo).removesuffix("-gguf") or "model"
        for i, each in enumerate([name, *(request.aliases or [])]):
            taken = self.models.named(each)
            if taken is not None and not taken.removed:
                field = "name" if i == 0 else f"aliases[{i - 1}]"
                raise Conflict(f"{field}: {each!r} is already a name of model {taken.id!r}; choose another name")
        return name

    async def start(self, request: ModelserveRequest, audit: AuditDraft) -> ModelserveJob:
        """Check and resolve the whole request, keep the job with the call's audit row, and run its steps."""
        self._checked(request)
        format = _format(request.format, request.file)
        repository = await self._repository(request.repo, format)
        if repository.gated and not self.hub.token:
            raise Forbidden(
                f"repo: {repository.repo} is gated: accept its conditions on the Hub, then set HF_TOKEN on the leader"
            )
        artifact = self._artifact(repository, request, format)
        context = max(request.ctx_pool or 0, request.context_length or 0) or DEFAULT_CONTEXT
        ways = self._ways(repository, artifact, request, context)
        name = self._free_name(request, repository)
        definition = self._definition(name, request, repository, artifact, ways)
        way = ways[0].option
        where = "the CPU" if way.cpu else f"{way.gpus_per_node}× {way.gpu_class}"
        resolved = (
            f"{repository.repo}@{repository.revision[:12]}: {artifact.name} ({artifact.bytes} bytes), "
            f"{ENGINE_WORDS[format]} on {where}, {way.need_gb} GB at {context} tokens"
        )
        job_id = new_serve_job_id()
        view = ModelserveJob(
            id=job_id, kind=None, request=request, state=RUNNING, model=name, steps=new_steps(resolved)
        )
        view.started = view.steps[0].at if view.steps else None
        with audit.commit(target=f"job:{job_id}", detail={"model": name, "repo": repository.repo}) as row:
            await run_sync(
                self.store.add_serve_job,
                job_id,
                view.model_dump_json(exclude_none=True, by_alias=True),
                runner=self.runner,
                at=view.started,
                audit=row,
            )
        live = LiveJob(view, self.store)
        self._live[job_id] = live
        what = Fetch(repository.repo, repository.revision, artifact, self.weights_dir)
        self._tasks[job_id] = asyncio.create_task(
            self._run(live, what, definition, audit.actor, embeddings=bool(request.embeddings)), name=f"serve {job_id}"
        )
        return view.model_copy(deep=True)

    async def begin(
        self,
        view: ModelserveJob,
        audit: AuditDraft,
        target: str,
        detail: dict[str, Any],
        work: Callable[[LiveJob], Awaitable[None]],
    ) -> ModelserveJob:
        """Keep a job another area carries out (an update, a rollback) with the call's audit row, and run ``work`` on
        it as this service runs its own: its end kept, a leader stopping under it marks it failed."""
        job_id = new_serve_job_id()
        view = view.model_copy(update={"id": job_id, "started": view.started or datetime.now(UTC)})
        with audit.commit(target=target, detail={"job": job_id, **detail}) as row:
            await run_sync(
                self.store.add_serve_job,
                job_id,
                view.model_dump_json(exclude_none=True, by_alias=True),
                runner=self.runner,
                at=view.started,
                audit=row,
            )
        live = LiveJob(view, self.store)
        self._live[job_id] = live
        self._tasks[job_id] = asyncio.create_task(self._carry(live, work), name=f"{view.kind} {job_id}")
        return view.model_copy(deep=True)

    async def _carry(self, job: LiveJob, work: Callable[[LiveJob], Awaitable[None]]) -> None:
        try:
            await work(job)
            job.view.state = "succeeded"
        except asyncio.CancelledError:
            job.fail(RESTARTED)
            await self._save_last(job)
            raise
        except (StepFailed, WeightsError, StoreError) as err:
            job.fail(str(err))
        except Exception as err:  # a job's failure is said in the job, never lost
            log.exception("%s job %s failed", job.view.kind, job.id)
            job.fail(f"{type(err).__name__}: {err}")
        await self._save_last(job)

    async def _run(self, job: LiveJob, what: Fetch, definition: CatalogModel, actor: str, *, embeddings: bool) -> None:
        name = definition.name or ""
        try:
            await fetch(job, what, self.hub)
            job.mark("place", "running", "adding the model")
            draft = AuditDraft(actor=actor, source=SOURCE_API, action="POST /api/v1/models/serve", status=202)
            draft.body = {"job": job.id, "repo": what.repo, "revision": what.revision}
            try:
                await self.models_service.add(definition, draft)
            except (InvalidInput, Conflict, NotFound) as err:
                raise StepFailed(str(err)) from None
            if not (definition.scaling and definition.scaling.min):
                job.mark("place", "skipped", "on demand: the smoke test's request places and starts it")
                job.mark("start", "skipped", "on demand: the smoke test's request places and starts it")
            else:
                await wait_placed(job, name, self.models, self.desk)
                job.mark("start", "running")
                await wait_started(job, name, self.fleet, self.desk)
            job.mark("smoke test", "running")
            await smoke_test(job, name, self.asker, embeddings=embeddings)
            job.mark("eval", "skipped", EVAL_SKIPPED)
            job.view.state = "succeeded"
        except asyncio.CancelledError:
            job.fail(RESTARTED)
            await self._save_last(job)
            raise
        except (StepFailed, WeightsError) as err:
            job.fail(str(err))
        except Exception as err:  # a job's failure is said in the job, never lost
            log.exception("serve job %s failed", job.id)
            job.fail(f"{type(err).__name__}: {err}")
        await self._save_last(job)

    async def _save_last(self, job: LiveJob) -> None:
        try:
            await job.save()
        except Exception:
            log.exception("could not keep the end of serve job %s", job.id)
        finally:
            self._tasks.pop(job.id, None)
            self._live.pop(job.id, None)

    # --- reading --------------------------------------------------------------------------------------------

    async def jobs(self) -> list[ModelserveJob]:
        records = await run_sync(self.store.list_serve_jobs)
        return [self._view(r.id, r.job_json) for r in records]

    async def job(self, job_id: str) -> ModelserveJob:
        record = await run_sync(self.store.get_serve_job, job_id)
        if record is None:
            raise NotFound(f"id: no job {job_id!r}; GET /api/v1/jobs lists them")
        return self._view(record.id, record.job_json)

    def _view(self, job_id: str, text: str) -> ModelserveJob:
        live = self._live.get(job_id)
        if live is not None and job_id in self._tasks:
            return live.view.model_copy(deep=True)  # this leader runs it: its progress now, not as last written
        try:
            return ModelserveJob.model_validate_json(text)
        except ValidationError:
            return ModelserveJob(id=job_id, state="failed", error="the kept job cannot be read")

    # --- the lifespan ---------------------------------------------------------------------------------------

    def fail_interrupted(self) -> list[str]:
        """Mark failed, with the reason, the jobs this leader left running when it last stopped (at start, off the
        loop, before any call is answered); their ids."""
        failed = []
        for record in self.store.unfinished_serve_jobs(self.runner):
            job = self._view(record.id, record.job_json)
            LiveJob(job, self.store).fail(RESTARTED)
            self.store.put_serve_job(record.id, "failed", job.model_dump_json(exclude_none=True, by_alias=True))
            log.warning("serve job %s was running when the leader stopped; it is marked failed", record.id)
            failed.append(record.id)
        return failed

    async def run(self, stop: asyncio.Event) -> None:
        """Until the leader stops; then the jobs still running end, failed with the reason."""
        try:
            await stop.wait()
        finally:
            running = list(self._tasks.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
