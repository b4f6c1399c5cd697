"""The shard operations the lead's ``/admin/v1/shards`` routes call: create, list, delete, delete one gang.

Gang records live in memory (``ShardManager.gangs``); the lead persists them
with :meth:`ShardManager.to_json` and puts them back with
:meth:`ShardManager.from_json`. One change per model at a time (create, delete
or heal): a second is refused with 409 rather than queued behind a load that
may take minutes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path

from opod.contract.catalog import Entry
from opod.engines import rpc_binary
from opod.engines.errors import LaunchError
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.shards import calls
from opod.shards.calls import Timing
from opod.shards.distribute import Digests, checked_digest, leader_file, place_file
from opod.shards.errors import ShardError, conflict, not_found, worker_failed
from opod.shards.healing import heal_round
from opod.shards.planning import ShardPlan, gone_reason, place, plan_for
from opod.shards.records import (
    Coordinator,
    Gang,
    GangState,
    Part,
    ProcessState,
    RemovedGangs,
    gangs_from_json,
    gangs_to_json,
    new_gang_id,
    part_process_id,
)

log = logging.getLogger("opod.shards")

Emit = Callable[[str, str, dict], object]
"""``emit(type, subject, data)``; may return an awaitable. The subject is the model id."""

SHARD_CREATED = "shard.created"
SHARD_REMOVED = "shard.removed"


class ShardManager:
    """Forms, lists, removes and heals llama.cpp RPC gangs over the leader's fleet.

    ``entries(model_id)`` gives the catalog entry (the lead's catalog, or the
    entry of a model added by path). ``coordinator_node`` is
    ``OPOD_COORDINATOR_NODE`` as the lead read it; ``local_node`` is the node id
    of the worker inside the leader's own process (what ``local`` means).
    ``rpc_route`` defaults to :func:`opod.engines.rpc_binary.resolve`, asked at
    each create so an install fixed after start-up is seen.
    """

    def __init__(
        self,
        fleet: Fleet,
        workers: WorkerClient,
        entries: Callable[[str], Entry | None],
        *,
        emit: Emit | None = None,
        coordinator_node: str | None = None,
        local_node: str | None = None,
        rpc_route: rpc_binary.RpcRoute | None = None,
        timing: Timing | None = None,
        miss_limit: int = 2,
    ) -> None:
        self.fleet = fleet
        self.workers = workers
        self.entries = entries
        self._emit_to = emit
        self.coordinator_node = coordinator_node
        self.local_node = local_node
        self.rpc_route = rpc_route
        self.timing = timing or Timing()
        self.miss_limit = miss_limit
        self.gangs: dict[str, Gang] = {}
        self.digests = Digests()
        self.misses: dict[tuple[str, str, str], int] = {}
        """(gang id, node id, process id) → checks in a row the worker did not answer about that process."""
        self.busy: dict[str, str] = {}
        """model → the change under way (create, delete, heal)."""
        self._unreachable: dict[str, tuple[float, str]] = {}

    # --- shared helpers ---------------------------------------------------------

    async def emit(self, kind: str, model: str, data: dict) -> None:
        if self._emit_to is None:
            return
        try:
            result = self._emit_to(kind, model, data)
            if inspect.isawaitable(result):
                await result
        except Exception:  # an event sink's failure must not undo a gang change
            log.exception("emitting %s for %s failed", kind, model)

    def node(self, node_id: str) -> NodeState | None:
        return self.fleet.get(node_id)

    def unreachable(self, node_id: str, why: str) -> None:
        """Remember that a call to this worker failed; placement avoids it until its next heartbeat."""
        self._unreachable[node_id] = (time.monotonic(), why)

    def suspect(self) -> dict[str, str]:
        out = {}
        for node_id, (at, why) in list(self._unreachable.items()):
            node = self.fleet.get(node_id)
            if node is not None and node.last_heartbeat > at:
                del self._unreachable[node_id]
            else:
                out[node_id] = f"did not answer the leader {time.monotonic() - at:.0f}s ago"
        return out

    def _claim(self, model: str, what: str) -> None:
        if model in self.busy:
            raise conflict(f"a {self.busy[model]} of {model}'s gangs is under way; try again when it ends")
        self.busy[model] = what

    def route(self) -> rpc_binary.RpcRoute:
        if self.rpc_route is not None:
            return self.rpc_route
        try:
            return rpc_binary.resolve()
        except LaunchError as err:
            raise ShardError(409, "rpc_server_missing", str(err)) from None

    def plan(self, gang: Gang) -> ShardPlan:
        entry = self.entries(gang.model)
        if entry is None:
            raise not_found(f"model {gang.model!r} left the catalog; its gang {gang.id} cannot be re-formed")
        return ShardPlan(model=gang.model, shards=gang.shards, port_base=gang.port_base, entry=entry)

    # --- operations ---------------------------------------------------------------

    async def create(self, model_id: str, shards: int | None = None) -> Gang:
        """Form a gang of ``model_id`` over ``shards`` workers (the catalog's default when ``None``).

        Returns once the coordinator serves and its worker's heartbeat lists the
        model. On any failure everything started is stopped again and the
        ShardError says what failed and what was undone.
        """
        plan = plan_for(model_id, self.entries(model_id), shards)
        self._claim(model_id, "create")
        try:
            return await self._create(plan)
        finally:
            self.busy.pop(model_id, None)

    async def _create(self, plan: ShardPlan) -> Gang:
        started = time.monotonic()
        route = self.route()
        placement = place(plan, list(self.fleet), pinned=self.coordinator_node, local_node=self.local_node,
                          gangs=self.gangs.values(), suspect=self.suspect())
        source = plan.entry.source
        local = leader_file(plan.model, source)
        digest = await checked_digest(plan.model, local, source, self.digests) if local is not None else ""
        coordinator = placement.coordinator
        gang = Gang(id=new_gang_id(), model=plan.model, shards=plan.shards, port_base=plan.port_base,
                    coordinator=Coordinator(node=coordinator.id, address=coordinator.address))
        gang.parts = [Part(index=i, node=n.id, address="", port=0, process_id=part_process_id(plan.model, gang.id, i))
                      for i, n in enumerate(placement.parts)]
        self.gangs[gang.id] = gang
        try:
            await self._form(gang, plan, route, local, digest, started)
        except BaseException as err:  # nothing half-applied: whatever failed, undo what was started
            undone = await self._teardown(gang, unload=True)
            del self.gangs[gang.id]
            if not isinstance(err, ShardError | WorkerUnavailable):
                raise
            message = err.message if isinstance(err, ShardError) else str(err)
            stopped = ", ".join(sorted({p.node for p in gang.parts}))
            tail = f"; rolled back: stopped the parts on {stopped} and unloaded the coordinator on {gang.coordinator.node}"
            if undone.unreached:
                tail += f" (not reached: {', '.join(undone.unreached)})"
            raise ShardError(err.status if isinstance(err, ShardError) else 502,
                             err.kind if isinstance(err, ShardError) else "worker_failed",
                             f"creating a gang of {plan.model} failed: {message}{tail}") from None
        gang.state = GangState.SERVING
        gang.timings["total"] = round(time.monotonic() - started, 3)
        log.info("gang %s of %s serving: coordinator on %s, parts %s", gang.id, gang.model, gang.coordinator.node, gang.rpc_list())
        await self.emit(SHARD_CREATED, gang.model, {
            "gang": gang.id, "coordinator": gang.coordinator.node, "shards": gang.shards,
            "parts": [{"index": p.index, "node": p.node, "address": p.address} for p in gang.parts],
            "uploaded": gang.coordinator.uploaded, "seconds": gang.timings["total"],
        })
        return gang

    async def _form(self, gang: Gang, plan: ShardPlan, route: rpc_binary.RpcRoute, local: Path | None, digest: str, started: float) -> None:
        commands = rpc_binary.fallback_commands(route)
        coordinator = self._require(gang.coordinator.node)

        async def one_part(part: Part) -> None:
            await self.start_part(gang, part, self._require(part.node), plan, commands)

        async def weights() -> None:
            if local is not None:
                t = time.monotonic()
                placed = await self._guard(coordinator, place_file(self.workers, coordinator, local, digest))
                gang.coordinator.weights, gang.coordinator.uploaded = placed.path, placed.uploaded
                gang.timings["weights"] = round(time.monotonic() - t, 3)

        results = await asyncio.gather(*(one_part(p) for p in gang.parts), weights(), return_exceptions=True)
        gang.timings["parts"] = round(time.monotonic() - started, 3)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        await self.start_coordinator(gang, plan)

    async def start_part(self, gang: Gang, part: Part, node: NodeState, plan: ShardPlan, commands: list[str]) -> None:
        ran = await self._guard(node, calls.start_part(self.workers, node, part.process_id, plan.ports(part.index), commands, self.timing))
        part.node, part.port, part.command = node.id, ran.port, ran.command
        part.address = f"{calls.host_of(node)}:{ran.port}"
        part.state, part.detail = ProcessState.RUNNING, ""

    async def start_coordinator(self, gang: Gang, plan: ShardPlan) -> None:
        """Load the coordinator on its worker with the gang's RPC list, and wait until it serves."""
        t = time.monotonic()
        node = self._require(gang.coordinator.node)
        gang.coordinator.state = ProcessState.STARTING
        req = calls.load_request(gang.model, plan.entry.source, gang.coordinator.weights, gang.rpc_list())
        await self._guard(node, calls.load_coordinator(self.workers, self.node, node.id, req, self.timing))
        gang.coordinator.address = node.address
        gang.coordinator.state, gang.coordinator.detail = ProcessState.RUNNING, ""
        gang.timings["coordinator"] = round(time.monotonic() - t, 3)

    def _require(self, node_id: str) -> NodeState:
        node = self.fleet.get(node_id)
        if node is None:
            raise worker_failed(f"worker {node_id} left the fleet while its gang was being formed")
        return node

    async def _guard(self, node: NodeState, call):
        """Await a call to ``node``; an unreachable worker is remembered and reported as a ShardError."""
        try:
            return await call
        except WorkerUnavailable as err:
            self.unreachable(node.id, str(err))
            raise worker_failed(str(err)) from None

    async def list(self) -> list[Gang]:
        """Every gang, by model and age, with its state."""
        return sorted(self.gangs.values(), key=lambda g: (g.model, g.created_at))

    async def delete(self, model_id: str) -> RemovedGangs:
        """Stop every gang of ``model_id``: coordinator unloaded, parts stopped."""
        gangs = [g for g in self.gangs.values() if g.model == model_id]
        if not gangs:
            models = sorted({g.model for g in self.gangs.values()})
            raise not_found(f"model {model_id!r} has no gangs" + (f"; gangs exist for: {', '.join(models)}" if models else "; there are no gangs"))
        return await self._remove(model_id, gangs)

    async def delete_gang(self, model_id: str, gang_id: str) -> RemovedGangs:
        gang = self.gangs.get(gang_id)
        if gang is None or gang.model != model_id:
            ids = sorted(g.id for g in self.gangs.values() if g.model == model_id)
            raise not_found(f"model {model_id!r} has no gang {gang_id!r}" + (f"; its gangs: {', '.join(ids)}" if ids else "; it has no gangs"))
        return await self._remove(model_id, [gang])

    async def _remove(self, model_id: str, gangs: list[Gang]) -> RemovedGangs:
        self._claim(model_id, "delete")
        unreached: list[str] = []
        try:
            for gang in gangs:
                gang.state = GangState.REMOVING
                undone = await self._teardown(gang, unload=True)
                unreached += undone.unreached
                self.gangs.pop(gang.id, None)
                for key in [k for k in self.misses if k[0] == gang.id]:
                    del self.misses[key]
                await self.emit(SHARD_REMOVED, model_id, {"gang": gang.id, "unreached": undone.unreached})
        finally:
            self.busy.pop(model_id, None)
        return RemovedGangs(model=model_id, removed=gangs, unreached=unreached)

    async def _teardown(self, gang: Gang, *, unload: bool) -> RemovedGangs:
        """Unload the coordinator and stop every part; what could not be reached is named, never raised."""
        unreached: list[str] = []
        source = entry.source if (entry := self.entries(gang.model)) is not None else None

        async def quietly(node_id: str, what: str, call) -> None:
            node = self.fleet.get(node_id)
            why = gone_reason(node, node_id)
            if not why:
                try:
                    await call(node)
                    return
                except WorkerUnavailable as err:
                    why = str(err)
            unreached.append(f"{node_id}: {what}: {why}")

        jobs = [quietly(p.node, f"part {p.index}", lambda n, p=p: calls.stop_process(self.workers, n, p.process_id)) for p in gang.parts]
        if unload:
            jobs.append(quietly(gang.coordinator.node, "coordinator",
                                lambda n: calls.unload_coordinator(self.workers, n, gang.model, source)))
        await asyncio.gather(*jobs)
        for part in gang.parts:
            part.state = ProcessState.STOPPED
        gang.coordinator.state = ProcessState.STOPPED
        return RemovedGangs(model=gang.model, removed=[gang], unreached=unreached)

    # --- healing (the loop lives in opod.shards.healing) ------------------------------

    async def heal_once(self) -> list[str]:
        """Check every gang once and re-form those that lost a part or their coordinator; what was done, in words."""
        return await heal_round(self)

    async def run_healer(self, stop: asyncio.Event, every: float = 5.0) -> None:
        """The lead runs this as a task beside the reconciler."""
        while not stop.is_set():
            try:
                await self.heal_once()
            except Exception:  # one bad round must not end healing
                log.exception("shard heal round failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except TimeoutError:
                pass

    # --- persistence ---------------------------------------------------------------

    def to_json(self) -> str:
        return gangs_to_json([g for g in self.gangs.values() if g.state is not GangState.FORMING])

    def from_json(self, text: str | bytes) -> list[Gang]:
        """Put back gangs saved by :meth:`to_json` (replacing those in memory); the healer then checks each.

        A gang saved while it was being removed is kept as ``degraded`` so the
        operator sees it and can delete it again.
        """
        gangs = gangs_from_json(text)
        for gang in gangs:
            if gang.state is GangState.REMOVING:
                gang.state, gang.detail = GangState.DEGRADED, "was being removed when the leader stopped; delete it again"
            elif gang.state is GangState.HEALING:
                gang.state = GangState.DEGRADED
        self.gangs = {g.id: g for g in gangs}
        self.misses.clear()
        return gangs
