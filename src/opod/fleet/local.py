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
        self.workers: dict[str, EngineUrl] = {}
        """In-process worker's id → which of its engines serves a model. Read as a dict on every relayed request:
        one lookup answers both whether the worker is in this process and where its engine is."""

    def attach(self, node_id: str, engine_url: EngineUrl) -> None:
        """Worker ``node_id`` runs in this process; its engines listen on loopback only."""
        self.workers[node_id] = engine_url
