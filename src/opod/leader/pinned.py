"""Models loaded where they are pinned: a node, or anywhere, for a model without a definition.

The older way of placing a model, kept for ``load``/``unload`` on one node (the
opod extension routes, ``/admin/v1`` moves) and for models added without a
definition: load it where it is wanted and not held, unload it where it is not
wanted. A load answered ``ready`` counts as pending until a heartbeat lists the
model; a failed one is tried again after a back-off, its reason kept for listings.
Replicas of defined models are the reconciler's (``leader.reconciler``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from opod.catalog.adapters import load_adapters
from opod.contract import nodeapi
from opod.fleet.models import ANY_NODE, KnownModel
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


def unload_request(model_id: str, model: KnownModel | None) -> nodeapi.UnloadModelRequest:
    """What a worker is asked to unload: the model, named by its weights' source as it was loaded."""
    source = model.entry.source if model is not None and model.entry is not None else None
    return nodeapi.UnloadModelRequest(
        id=model_id,
        ollama_name=source.ollama_name if source else "",
        repo=source.repo if source else "",
        path=source.path if source else "",
    )


class PinnedLoads:
    def __init__(self, fleet: Fleet, workers: WorkerClient) -> None:
        self.fleet = fleet
        self.workers = workers
        self.attempts: dict[tuple[str, str], Attempt] = {}
        """(model, node) → the last load asked there, and how it went."""

    def attempts_of(self, model_id: str) -> list[Attempt]:
        return [a for (m, _), a in self.attempts.items() if m == model_id]

    def loads(self, model: KnownModel, node_key: str, live: list[NodeState], now: float) -> list[Awaitable[None]]:
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
        busy = [
            a for (m, _), a in self.attempts.items() if m == model.id and not a.error and now - a.started < PENDING_FOR
        ]
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

    def unloads(self, model: KnownModel, node_key: str, live: list[NodeState]) -> list[Awaitable[None]]:
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
            adapters=load_adapters(model.definition),
        )
        try:
            status, body = await self.workers.call_json(
                node, "POST", nodeapi.PATH_MODEL_LOAD, req.to_wire(), timeout=30
            )
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
        req = unload_request(model.id, model)
        try:
            status, body = await self.workers.call_json(
                node, "POST", nodeapi.PATH_MODEL_UNLOAD, req.to_wire(), timeout=60
            )
        except WorkerUnavailable as err:
            log.warning("unloading %s on %s: %s", model.id, node.id, err)
            return
        log.info("unloading %s on %s: HTTP %s", model.id, node.id, status)
        self._forget(model.id, node.id)
