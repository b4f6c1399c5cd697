"""Workers running inside this leader's process, whose engines the relay calls directly.

``opod up`` starts a worker beside the leader; asking it through its own listener would
be one hop more for every request. The worker says, per model, which engine serves it.
"""

from __future__ import annotations

from collections.abc import Callable

EngineUrl = Callable[[str], str | None]
"""model → the base URL of the in-process worker's engine serving it, or ``None`` when none does."""


class LocalEngines:
    def __init__(self) -> None:
        self._workers: dict[str, EngineUrl] = {}

    def attach(self, node_id: str, engine_url: EngineUrl) -> None:
        """Worker ``node_id`` runs in this process; its engines listen on loopback only."""
        self._workers[node_id] = engine_url

    def url(self, node_id: str, model: str) -> str | None:
        """The engine serving ``model`` on in-process worker ``node_id``; ``None`` when it is not one or serves none."""
        engine_url = self._workers.get(node_id)
        return engine_url(model) if engine_url is not None else None

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._workers
