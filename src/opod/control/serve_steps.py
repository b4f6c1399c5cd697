"""One serve job carried out, step by step: fetch, place, start, smoke test (``POST /api/v1/models/serve``).

A :class:`LiveJob` is the job as ``/api/v1/jobs`` shows it, changed only by its own task and
written to the store at every step and, while bytes arrive, at most twice a second. Fetching
uses the Hub client (resumable, digest-checked) into the leader's weights folder, where a worker
on this machine finds them; placing adds an ordinary model through the models' one writer, whose
reconciler then places and starts it; the smoke test is one chat request through the gateway,
as a client's would go.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from opod.contract.admin.models import ModelserveJob, ModelserveStep
from opod.control.context import Replayer, ReplicaDesk
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.store import Store
from opod.store.offloop import run_sync
from opod.weights.hub import HubClient, HubSettings
from opod.weights.progress import FetchMeter
from opod.weights.registry import Artifact

log = logging.getLogger("opod.serve")

STEPS = ("resolve", "fetch", "place", "start", "smoke test", "eval")
SAVE_EVERY = 0.5
"""Seconds between writes of a fetch's progress: a listing sees it move, the store is not written per chunk."""
PLACE_WAIT = 60.0
START_WAIT = 600.0
POLL = 0.2
SMOKE_PROMPT = "Say hello in five words."
SMOKE_TOKENS = 24
EVAL_SKIPPED = "skipped: no suite asked; POST /models/{name}/eval runs one"


class StepFailed(Exception):
    """A step could not be done; the message says why and what to do."""


class LiveJob:
    """A job while its task runs: its view, changed step by step and written through to the store."""

    def __init__(self, view: ModelserveJob, store: Store) -> None:
        self.view = view
        self.store = store
        self._saved = 0.0

    @property
    def id(self) -> str:
        return self.view.id or ""

    def _step(self, name: str) -> ModelserveStep:
        return next(s for s in self.view.steps or [] if s.name == name)

    def current(self) -> str:
        """The step running now, or the first still waiting."""
        steps = self.view.steps or []
        running = next((s for s in steps if s.state == "running"), None)
        waiting = next((s for s in steps if s.state == "waiting"), None)
        found = running or waiting or (steps[-1] if steps else None)
        return (found.name or "") if found is not None else ""

    def mark(self, name: str, state: str, detail: str | None = None) -> None:
        step = self._step(name)
        step.state, step.at = state, datetime.now(UTC)
        if detail is not None:
            step.detail = detail or None

    def say(self, name: str, detail: str) -> None:
        """A running step's detail, without moving its time."""
        self._step(name).detail = detail or None

    async def save(self, *, throttle: bool = False) -> None:
        now = time.monotonic()
        if throttle and now - self._saved < SAVE_EVERY:
            return
        self._saved = now
        body = self.view.model_dump_json(exclude_none=True, by_alias=True)
        await run_sync(self.store.put_serve_job, self.id, self.view.state or "running", body)

    def fail(self, reason: str) -> None:
        name = self.current()
        if name:
            self.mark(name, "failed", reason)
        for step in self.view.steps or []:
            if step.state == "waiting":
                step.state = "skipped"
        self.view.state = "failed"
        self.view.error = f"{name}: {reason}" if name else reason


def new_steps(resolved: str) -> list[ModelserveStep]:
    now = datetime.now(UTC)
    steps = [ModelserveStep(name=name, state="waiting") for name in STEPS]
    steps[0] = ModelserveStep(name="resolve", state="done", detail=resolved, at=now)
    return steps


@dataclass(frozen=True, slots=True)
class Fetch:
    """What a job fetches: the artifact's files of one commit, pinned to the digests the Hub listed."""

    repo: str
    revision: str
    artifact: Artifact
    dest: Path


async def fetch(job: LiveJob, what: Fetch, hub: HubSettings) -> None:
    """Download every file of the artifact, its byte progress in the step's detail; a digest that fails fails it."""
    job.mark("fetch", "running", f"{what.artifact.name}: starting")
    await job.save()
    total = what.artifact.bytes
    meter = FetchMeter(what.artifact.name)
    before = 0
    async with HubClient(hub) as client:
        for part in what.artifact.files:

            def progress(done: int, _total: int | None, _before: int = before) -> None:
                meter(_before + done, total)
                job.say("fetch", meter.describe())

            # The commit's folder, pinned to the listed digest: where a worker on this machine looks for that commit,
            # beside any other commit's files (an update's, a rollback's).
            await client.download(what.repo, part.path, what.revision, what.dest, listed=part, progress=progress)
            await job.save(throttle=True)
            before += part.size
    meter(total, total)
    job.mark("fetch", "done", meter.describe())
    await job.save()


async def wait_placed(job: LiveJob, name: str, models: ModelRegistry, desk: ReplicaDesk) -> None:
    """Until the reconciler has given the model a replica; fails when it cannot be placed, saying why."""
    deadline = time.monotonic() + PLACE_WAIT
    while True:
        mine = [r for r in desk.replica_list() if r.model == name]
        if mine:
            job.mark("place", "done", f"on {'+'.join(mine[0].nodes)} (profile {mine[0].profile_name})")
            await job.save()
            return
        model = models.get(name)
        if model is not None and model.status.unplaceable and desk.last_rejections.get(name):
            lines = "; ".join(f"{r.node}: {r.reason}" for r in desk.last_rejections[name])
            raise StepFailed(
                f"no node takes it now ({lines}); the model stays in the catalog: GET /api/v1/explain-placement?model={name}"
            )
        if time.monotonic() > deadline:
            raise StepFailed(f"not placed within {PLACE_WAIT:.0f} s: {desk.status(name)}")
        job.say("place", desk.status(name))
        await job.save(throttle=True)
        await _sleep()


async def wait_started(job: LiveJob, name: str, fleet: Fleet, desk: ReplicaDesk) -> None:
    """Until a worker serves it; fails when its replica failed or it was parked, with the engine's words."""
    deadline = time.monotonic() + START_WAIT
    while name not in fleet.served_models():
        status = desk.status(name)
        if status.startswith(("parked", "failed")):
            raise StepFailed(f"{status}; the model stays in the catalog (DELETE /api/v1/models/{name} removes it)")
        if time.monotonic() > deadline:
            raise StepFailed(f"not serving within {START_WAIT:.0f} s: {status}")
        job.say("start", status)
        await job.save(throttle=True)
        await _sleep()
    job.mark("start", "done", desk.status(name))
    await job.save()


async def smoke_test(job: LiveJob, name: str, asker: Replayer, *, embeddings: bool) -> None:
    """One request through the gateway, as a client's: its reply and tokens a second go in the job."""
    body: dict[str, object]
    if embeddings:
        path, body = "/v1/embeddings", {"model": name, "input": "hello"}
    else:
        path = "/v1/chat/completions"
        body = {"model": name, "messages": [{"role": "user", "content": SMOKE_PROMPT}], "max_tokens": SMOKE_TOKENS}
    started = time.monotonic()
    status, raw = await asker.replay(path, json.dumps(body).encode(), f"{job.id}-smoke")
    took = max(time.monotonic() - started, 1e-6)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = {}
    if status != 200 or not isinstance(answer, dict):
        raise StepFailed(f"{path} answered {status}: {raw[:300].decode(errors='replace')}")
    if embeddings:
        vector = (answer.get("data") or [{}])[0].get("embedding") or []
        job.view.reply = f"an embedding of {len(vector)} dimensions"
    else:
        choice = (answer.get("choices") or [{}])[0]
        job.view.reply = str((choice.get("message") or {}).get("content") or "")
        tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        job.view.tokens_per_second = round(tokens / took, 2)
    job.mark("smoke test", "done", f"{path} answered in {took * 1000:.0f} ms")
    await job.save()


async def _sleep() -> None:
    await asyncio.sleep(POLL)
