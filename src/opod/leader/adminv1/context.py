"""What the ``/admin/v1`` handlers work on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.gateway.stats import GatewayStats
from opod.http.nodeclient import WorkerClient


class AdminError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def response(self) -> Response:
        return Response(json.dumps({"error": {"message": self.message, "type": self.kind}}), status_code=self.status,
                        media_type="application/json")


@dataclass
class AdminContext:
    store: Any
    fleet: Fleet
    models: ModelRegistry
    workers: WorkerClient
    stats: GatewayStats
    kick_reconciler: Callable[[], None]
    emit: Callable[[str, str, dict], None]
    ledger: Any = None
    """``opod.ledger.Ledger`` when the streams are available."""
    shards: Any = None
    """``opod.shards.ShardManager`` when sharding is available."""
    plan: Callable[[], Any] = lambda: None
    prefix_index: Callable[[], Any] = lambda: None
    tls: Callable[[], bool] = lambda: False
    """Whether the public listener serves TLS (then worker certificates are verified)."""

    async def db(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.store, method), *args, **kwargs)

    def node(self, node_id: str):
        node = self.fleet.get(node_id)
        if node is None:
            raise AdminError(404, f"node {node_id!r} is not known to this leader; GET /admin/v1/nodes lists them", "not_found")
        return node
