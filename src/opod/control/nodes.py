"""``/api/v1/nodes`` and ``/api/v1/agents/restart``: the fleet's nodes, their state, labels, logs, builds and releases.

Thin handlers over :class:`~opod.fleet.nodes_service.NodesService`, the one writer of the operator's
side of nodes (and the caller of workers for their logs and restarts); the views are
:mod:`opod.control.node_views`'.
"""

from __future__ import annotations

import time

from fastapi import Depends, Response

from opod.contract.admin.fleet import (
    AgentRestartView,
    LogsView,
    NodeEngineRequest,
    NodeLabelsRequest,
    NodeLabelsView,
    NodeRemoved,
    NodeStateRequest,
    NodeStateView,
    NodeView,
    UpgradeRequest,
    UpgradeView,
)
from opod.control.audit import audit_draft
from opod.control.context import ReplicaDesk
from opod.control.node_views import NodeList, held_devices, location_view
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.fleet.liveness import model_states
from opod.fleet.nodes_service import NodesService
from opod.fleet.state import Fleet
from opod.store.audit import AuditDraft


def router(nodes: NodesService, fleet: Fleet, reconciler: ReplicaDesk) -> SpecRouter:
    """``nodes`` changes them and calls their workers; ``fleet`` and the ``reconciler``'s replicas are read for the
    views."""
    api = SpecRouter()
    listing = NodeList()

    @api.get("/api/v1/nodes", operation_id="getNodes", tags=["nodes"], response_model=list[NodeView])
    async def get_nodes() -> Response:
        now, wall, held = time.monotonic(), time.time(), held_devices(reconciler.replica_list())
        return Response(listing.json(list(fleet), held, now, wall), media_type="application/json")

    @api.delete("/api/v1/nodes/{id}", operation_id="deleteNodesId", tags=["nodes"], response_model=NodeRemoved)
    async def delete_nodes_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> NodeRemoved:
        """Forget a node: a lost one, or an unreachable one with nothing on it."""
        await nodes.forget(id, draft)
        return NodeRemoved(id=id, removed="true")

    @api.post(
        "/api/v1/nodes/{id}/engines",
        operation_id="postNodesIdEngines",
        tags=["nodes"],
        response_model=NodeEngineRequest,
    )
    async def post_nodes_id_engines(
        id: str, body: NodeEngineRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> NodeEngineRequest:
        engine, build = await nodes.set_engine_build(id, body.engine, body.build, draft)
        return NodeEngineRequest(engine=engine, build=build)

    @api.post(
        "/api/v1/nodes/{id}/labels", operation_id="postNodesIdLabels", tags=["nodes"], response_model=NodeLabelsView
    )
    async def post_nodes_id_labels(
        id: str, body: NodeLabelsRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> NodeLabelsView:
        node = await nodes.set_labels(id, body.set, body.remove, draft)
        merged = node.inventory.all_labels()
        return NodeLabelsView(
            id=id, operator_labels=node.inventory.operator_labels, labels=merged, location=location_view(merged)
        )

    @api.get("/api/v1/nodes/{id}/logs", operation_id="getNodesIdLogs", tags=["nodes"], response_model=LogsView)
    async def get_nodes_id_logs(id: str, lines: int | None = None, source: str | None = None) -> LogsView:
        return await nodes.logs(id, lines, source)

    @api.post("/api/v1/nodes/{id}/state", operation_id="postNodesIdState", tags=["nodes"], response_model=NodeStateView)
    async def post_nodes_id_state(
        id: str, body: NodeStateRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> NodeStateView:
        return NodeStateView(id=id, state=await nodes.set_state(id, body.state, draft))

    @api.post(
        "/api/v1/nodes/{id}/upgrade", operation_id="postNodesIdUpgrade", tags=["nodes"], response_model=UpgradeView
    )
    async def post_nodes_id_upgrade(
        id: str, body: UpgradeRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> UpgradeView:
        return UpgradeView(node=id, version=await nodes.want_release(id, body.version, draft))

    @api.post(
        "/api/v1/agents/restart", operation_id="postAgentsRestart", tags=["agents"], response_model=AgentRestartView
    )
    async def post_agents_restart() -> AgentRestartView:
        """Each reachable worker starts its agent again, its engines kept serving: ``opod join``'s as a new process
        (``worker.adoption``), ``opod up``'s own in place. A worker that cannot now (a model's weights still
        being fetched there) answers 409 and is left out of ``nodes``."""
        return AgentRestartView(nodes=await nodes.restart_agents())

    @api.get(
        "/api/v1/opod/node-models",
        operation_id="getOpodNodeModels",
        tags=[EXTENSION_TAG],
        response_model=dict[str, dict[str, str]],
    )
    async def get_node_models() -> dict[str, dict[str, str]]:
        """node id → each model it holds or says anything of: ``serving``, or why not (what ``opod node ls`` shows)."""
        now = time.monotonic()
        return {node.id: model_states(node, now) for node in fleet}

    return api
