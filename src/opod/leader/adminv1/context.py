"""What the ``/admin/v1`` handlers work on, and the one shape of their errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response

from opod.contract import adminapi
from opod.fleet.followers import EventSink
from opod.fleet.models import ModelRegistry
from opod.fleet.nodes_service import NodesService
from opod.fleet.state import Fleet, NodeState
from opod.gateway.stats import GatewayStats
from opod.http.errors import shown
from opod.http.nodeclient import WorkerClient
from opod.leader.webhooks import WebhookCounts
from opod.ledger import Ledger
from opod.shards import ShardManager
from opod.store import Store


def admin_error_response(status: int, message: str, kind: str = "invalid_request") -> Response:
    """The leader's error body on /admin/v1 and the join paths: ``{"error": {"message", "type"}}``."""
    return Response(
        json.dumps({"error": {"message": message, "type": kind}}), status_code=status, media_type="application/json"
    )


class AdminError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def response(self) -> Response:
        return admin_error_response(self.status, self.message, self.kind)


@dataclass(frozen=True, slots=True)
class AdminContext:
    store: Store
    fleet: Fleet
    models: ModelRegistry
    workers: WorkerClient
    stats: GatewayStats
    kick_reconciler: Callable[[], None]
    emit: EventSink
    ledger: Ledger
    shards: ShardManager
    nodes: NodesService
    """The operator's side of nodes: drain and undrain change it as ``/api/v1/nodes/{id}/state`` does."""
    plan: Callable[[], adminapi.PlanSnapshot | None]
    prefix_index: Callable[[], adminapi.PrefixIndex | None]
    tls: bool
    """Whether the public listener serves TLS (then worker certificates are verified)."""
    stopping: Callable[[], bool] = lambda: False
    """True once the leader stops taking new requests: ``/readyz`` says not ready."""
    webhook_counts: WebhookCounts | None = None
    """What became of the events offered to the settings' webhooks, for ``/metrics``."""
    cluster: str = ""
    """This cluster's id, on ``/readyz`` answers for federation peers (``X-Llmgw-Cluster``)."""

    def node(self, node_id: str) -> NodeState:
        node = self.fleet.get(node_id)
        if node is None:
            raise AdminError(
                404, f"node {shown(node_id)} is not known to this leader; GET /admin/v1/nodes lists them", "not_found"
            )
        return node
