"""Bringing the fleet to what is wanted: load a model where it is wanted and not held, unload it where not wanted.

Runs every few seconds and whenever the fleet or the wanted state changes.
A load answered ``ready`` counts as pending until a heartbeat lists the model;
a load that fails is retried after a back-off, and its reason is kept for
``opod model ls``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from opod.contract import nodeapi
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable

log = logging.getLogger("opod.leader")

PENDING_FOR = 900.0
"""How long a load may take to show up in heartbeats (weights may be downloading)."""
RETRY_AFTER = 20.0
"""The first wait before a failed load is tried again; it doubles with each failure, up to ``RETRY_MAX``."""
RETRY_MAX = 600.0


@dataclass(slots=True)
class Attempt:
    node_id: str
    started: float
    error: str = ""
    failures: int = 0

    def retry_after(self) -> float:
        return min(RETRY_AFTER * 2 ** max(self.failures - 1, 0), RETRY_MAX)


class Reconciler:
    def __init__(self, fleet: Fleet, models: ModelRegistry, workers: WorkerClient, housekeeping=None) -> None:
        self.fleet = fleet
        self.models = models
        self.workers = workers
        self.housekeeping = housekeeping
        """Called once per round (sweeping the prefix index by age)."""
        self.attempts: dict[tuple[str, str], Attempt] = {}
        self._wake = asyncio.Event()

    def kick(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event, every: float = 3.0) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.reconcile()
                if self.housekeeping is not None:
                    self.housekeeping()
            except Exception:  # one bad round must not stop the loop
                log.exception("reconcile round failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=every)
            except TimeoutError:
                pass

    def status(self, model_id: str) -> str:
        """A short phrase for listings, in the words a client's 503 uses (``Fleet.availability``).

        ``serving on n1`` (and why any other holder cannot, in brackets), ``failed on n1: …``
        when a load was refused, ``cannot serve: n1: its engine crashed (…) and is restarting``,
        ``loading on n1 (…)``, ``waiting for a worker`` or ``not loaded``.
        """
        model = self.models.get(model_id)
        availability = self.fleet.availability(model_id)
        if availability.ok:
            others = f" ({availability.why()})" if availability.down else ""
            return "serving on " + ", ".join(availability.serving) + others
        pending = [a for (m, _), a in self.attempts.items() if m == model_id]
        failed = [a for a in pending if a.error]
        if failed:
            return f"failed on {failed[0].node_id}: {failed[0].error}"
        if any(state.word == "down" and not state.why.startswith("loading") for _, state in availability.down):
            return f"cannot serve: {availability.why()}"
        if pending:
            parts = []
            for attempt in pending:
                node = self.fleet.get(attempt.node_id)
                progress = node.load_progress.get(model_id, "") if node is not None else ""
                parts.append(attempt.node_id + (f" ({progress})" if progress else ""))
            return "loading on " + ", ".join(parts)
        if availability.down:
            return f"cannot serve: {availability.why()}"
        if model is not None and model.wants_loaded():
            return "waiting for a worker"
        return "not loaded"

    async def reconcile(self) -> None:
        now = time.monotonic()
        live = self.fleet.placeable(now)
        jobs = []
        for model in self.models:
            for node_key, wanted in model.wanted.items():
                if wanted == "loaded":
                    jobs += self._loads(model, node_key, live, now)
                else:
                    jobs += self._unloads(model, node_key, live)
        if jobs:
            await asyncio.gather(*jobs)
        for model in list(self.models):
            if model.removed and not any(model.id in n.loaded_models for n in self.fleet):
                self.models.remove(model.id)

    def _loads(self, model: KnownModel, node_key: str, live: list[NodeState], now: float) -> list:
        if node_key == ANY_NODE:
            if any(model.id in n.loaded_models for n in live):
                self._forget(model.id)
                return []
            # A node where the model is explicitly not wanted is never chosen for "anywhere".
            candidates = [n for n in live if model.wanted.get(n.id) != "unloaded"]
        else:
            candidates = [n for n in live if n.id == node_key]
            if candidates and model.id in candidates[0].loaded_models:
                self._forget(model.id, node_key)
                return []
        for (m, node_id), attempt in self.attempts.items():
            holder = self.fleet.get(node_id)
            if m == model.id and not attempt.error and holder is not None and model.id in holder.load_errors:
                attempt.error = holder.load_errors[model.id]
                attempt.failures += 1
        busy = [a for (m, _), a in self.attempts.items() if m == model.id and not a.error and now - a.started < PENDING_FOR]
        if busy:
            return []
        for node in sorted(candidates, key=lambda n: (len(n.loaded_models), n.id)):
            tried = self.attempts.get((model.id, node.id))
            if tried is not None and tried.error and now - tried.started < tried.retry_after():
                continue
            if model.engine and node.engine_id and model.engine != node.engine_id:
                continue
            return [self._load(model, node)]
        return []

    def _unloads(self, model: KnownModel, node_key: str, live: list[NodeState]) -> list:
        return [self._unload(model, n) for n in live if model.id in n.loaded_models and node_key in (ANY_NODE, n.id)]

    def _forget(self, model_id: str, node_id: str | None = None) -> None:
        for key in [k for k in self.attempts if k[0] == model_id and (node_id is None or k[1] == node_id)]:
            del self.attempts[key]

    async def _load(self, model: KnownModel, node: NodeState) -> None:
        previous = self.attempts.get((model.id, node.id))
        attempt = Attempt(node.id, time.monotonic(), failures=previous.failures if previous is not None else 0)
        self.attempts[(model.id, node.id)] = attempt
        source = model.entry.source if model.entry is not None else None
        req = nodeapi.LoadModelRequest(
            id=model.id,
            ollama_name=source.ollama_name if source else "",
            repo=source.repo if source else "",
            file=source.file if source else "",
            path=source.path if source else "",
        )
        try:
            status, body = await self.workers.call_json(node, "POST", nodeapi.PATH_MODEL_LOAD, req.to_wire(), timeout=30)
        except WorkerUnavailable as err:
            attempt.error = str(err)
            attempt.failures += 1
            return
        if status != 200:
            attempt.error = (body if isinstance(body, str) else str(body)).strip()[:300] or f"HTTP {status}"
            attempt.failures += 1
            log.warning("loading %s on %s refused: %s", model.id, node.id, attempt.error)
        else:
            log.info("loading %s on %s", model.id, node.id)

    async def _unload(self, model: KnownModel, node: NodeState) -> None:
        source = model.entry.source if model.entry is not None else None
        req = nodeapi.UnloadModelRequest(
            id=model.id,
            ollama_name=source.ollama_name if source else "",
            repo=source.repo if source else "",
            path=source.path if source else "",
        )
        try:
            status, body = await self.workers.call_json(node, "POST", nodeapi.PATH_MODEL_UNLOAD, req.to_wire(), timeout=60)
        except WorkerUnavailable as err:
            log.warning("unloading %s on %s: %s", model.id, node.id, err)
            return
        log.info("unloading %s on %s: HTTP %s", model.id, node.id, status)
        self._forget(model.id, node.id)
