"""The gangs in memory and the steps that start their processes, shared by creating and healing.

Creating a gang (:mod:`opod.shards.manager`) and re-forming one
(:mod:`opod.shards.healing`) start parts and coordinators the same way, read
one set of records, and must take the same one-change-per-model claim; both
hold a :class:`Gangs` instead of knowing each other.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from opod.contract.catalog import Entry
from opod.engines import rpc_binary
from opod.engines.errors import LaunchError
from opod.fleet.followers import EventSink
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.shards import calls
from opod.shards.calls import Timing
from opod.shards.distribute import Digests
from opod.shards.errors import ShardError, conflict, not_found, worker_failed
from opod.shards.planning import ShardPlan
from opod.shards.records import Gang, Part, ProcessState

log = logging.getLogger("opod.shards")

T = TypeVar("T")


class Gangs:
    """The gang records, the change under way for each model, and the calls that start a gang's processes.

    ``entries(model_id)`` gives the catalog entry; ``local_node`` the node id of
    the worker inside the leader's own process (``None``: the leader has none); ``rpc_route`` defaults to
    :func:`opod.engines.rpc_binary.resolve`, asked at each use so an install
    fixed after start-up is seen.
    """

    def __init__(
        self,
        fleet: Fleet,
        workers: WorkerClient,
        entries: Callable[[str], Entry | None],
        *,
        emit: EventSink | None = None,
        coordinator_node: str | None = None,
        local_node: str | None = None,
        rpc_route: rpc_binary.RpcRoute | None = None,
        timing: Timing | None = None,
    ) -> None:
        self.fleet = fleet
        self.workers = workers
        self.entries = entries
        self._emit_to = emit
        self.coordinator_node = coordinator_node
        self.local_node = local_node
        self._rpc_route = rpc_route
        self.timing = timing or Timing()
        self.records: dict[str, Gang] = {}
        self.digests = Digests()
        self._busy: dict[str, str] = {}
        """model → the change under way (create, delete, heal)."""
        self._unreachable: dict[str, tuple[float, str]] = {}

    # --- one change per model ------------------------------------------------------

    def claim(self, model: str, what: str) -> None:
        """Take ``model`` for one change, or refuse with 409 while another is under way."""
        if model in self._busy:
            raise conflict(f"a {self._busy[model]} of {model}'s gangs is under way; try again when it ends")
        self._busy[model] = what

    def release(self, model: str) -> None:
        self._busy.pop(model, None)

    def busy(self, model: str) -> bool:
        return model in self._busy

    # --- the fleet as gangs see it ---------------------------------------------------

    def node(self, node_id: str) -> NodeState | None:
        return self.fleet.get(node_id)

    def nodes(self) -> list[NodeState]:
        return list(self.fleet)

    def unreachable(self, node_id: str, why: str) -> None:
        """Remember that a call to this worker failed; placement avoids it until its next heartbeat."""
        self._unreachable[node_id] = (time.monotonic(), why)

    def suspect(self) -> dict[str, str]:
        out = {}
        for node_id, (at, _why) in list(self._unreachable.items()):
            node = self.fleet.get(node_id)
            if node is not None and node.last_heartbeat > at:
                del self._unreachable[node_id]
            else:
                out[node_id] = f"did not answer the leader {time.monotonic() - at:.0f}s ago"
        return out

    def require(self, node_id: str) -> NodeState:
        node = self.fleet.get(node_id)
        if node is None:
            raise worker_failed(f"worker {node_id} left the fleet while its gang was being formed")
        return node

    async def guard(self, node: NodeState, call: Awaitable[T]) -> T:
        """Await a call to ``node``; an unreachable worker is remembered and reported as a ShardError."""
        try:
            return await call
        except WorkerUnavailable as err:
            self.unreachable(node.id, str(err))
            raise worker_failed(str(err)) from None

    # --- what a gang is made of ------------------------------------------------------

    def route(self) -> rpc_binary.RpcRoute:
        if self._rpc_route is not None:
            return self._rpc_route
        try:
            return rpc_binary.resolve()
        except LaunchError as err:
            raise ShardError(409, "rpc_server_missing", str(err)) from None

    def plan(self, gang: Gang) -> ShardPlan:
        entry = self.entries(gang.model)
        if entry is None:
            raise not_found(f"model {gang.model!r} left the catalog; its gang {gang.id} cannot be re-formed")
        return ShardPlan(model=gang.model, shards=gang.shards, port_base=gang.port_base, entry=entry)

    async def start_part(self, gang: Gang, part: Part, node: NodeState, plan: ShardPlan, commands: list[str]) -> None:
        ran = await self.guard(
            node, calls.start_part(self.workers, node, part.process_id, plan.ports(part.index), commands, self.timing)
        )
        part.node, part.port, part.command = node.id, ran.port, ran.command
        part.address = f"{calls.host_of(node)}:{ran.port}"
        part.state, part.detail = ProcessState.RUNNING, ""

    async def start_coordinator(self, gang: Gang, plan: ShardPlan) -> None:
        """Load the coordinator on its worker with the gang's RPC list, and wait until it serves."""
        t = time.monotonic()
        node = self.require(gang.coordinator.node)
        gang.coordinator.state = ProcessState.STARTING
        req = calls.load_request(gang.model, plan.entry.source, gang.coordinator.weights, gang.rpc_list())
        await self.guard(node, calls.load_coordinator(self.workers, self.node, node.id, req, self.timing))
        gang.coordinator.address = node.address
        gang.coordinator.state, gang.coordinator.detail = ProcessState.RUNNING, ""
        gang.timings["coordinator"] = round(time.monotonic() - t, 3)

    # --- lifecycle events ----------------------------------------------------------

    async def emit(self, kind: str, model: str, data: Mapping[str, object]) -> None:
        if self._emit_to is None:
            return
        try:
            result = self._emit_to(kind, model, data)
            if inspect.isawaitable(result):
                await result
        except Exception:  # an event sink's failure must not undo a gang change
            log.exception("emitting %s for %s failed", kind, model)
