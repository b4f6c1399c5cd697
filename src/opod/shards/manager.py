"""The shard operations the lead's ``/admin/v1/shards`` routes call: create, list, delete, delete one gang.

Gang records live in memory (:class:`opod.shards.gangs.Gangs`, shared with the
healer of :mod:`opod.shards.healing`); the lead persists them
with :meth:`ShardManager.to_json` and puts them back with
:meth:`ShardManager.from_json`. One change per model at a time (create, delete
or heal): a second is refused with 409 rather than queued behind a load that
may take minutes.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from opod.engines import rpc_binary
from opod.fleet.state import NodeState
from opod.http.nodeclient import WorkerUnavailable
from opod.shards import calls
from opod.shards.distribute import checked_digest, leader_file, place_file
from opod.shards.errors import ShardError, not_found
from opod.shards.gangs import Gangs
from opod.shards.healing import Healer
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

SHARD_CREATED = "shard.created"
SHARD_REMOVED = "shard.removed"

__all__ = ["SHARD_CREATED", "SHARD_REMOVED", "ShardManager"]


class ShardManager:
    """Forms, lists, removes and heals llama.cpp RPC gangs over the leader's fleet.

    ``gangs`` holds the records and the calls that start a gang's processes (built by the
    composition root with the fleet, the workers and the catalog); ``miss_limit`` is how many
    missed heartbeats of a part's worker start a heal.
    """

    def __init__(self, gangs: Gangs, *, miss_limit: int = 2) -> None:
        self._gangs = gangs
        self._healer = Healer(self._gangs, miss_limit=miss_limit)

    # --- operations ---------------------------------------------------------------

    async def create(self, model_id: str, shards: int | None = None) -> Gang:
        """Form a gang of ``model_id`` over ``shards`` workers (the catalog's default when ``None``).

        Returns once the coordinator serves and its worker's heartbeat lists the
        model. On any failure everything started is stopped again and the
        ShardError says what failed and what was undone.
        """
        plan = plan_for(model_id, self._gangs.entries(model_id), shards)
        self._gangs.claim(model_id, "create")
        try:
            return await self._create(plan)
        finally:
            self._gangs.release(model_id)

    async def _create(self, plan: ShardPlan) -> Gang:
        gangs = self._gangs
        started = time.monotonic()
        route = gangs.route()
        placement = place(
            plan,
            gangs.nodes(),
            pinned=gangs.coordinator_node,
            local_node=gangs.local_node,
            gangs=gangs.records.values(),
            suspect=gangs.suspect(),
        )
        source = plan.entry.source
        local = leader_file(plan.model, source)
        digest = await checked_digest(plan.model, local, source, gangs.digests) if local is not None else ""
        coordinator = placement.coordinator
        gang = Gang(
            id=new_gang_id(),
            model=plan.model,
            shards=plan.shards,
            port_base=plan.port_base,
            coordinator=Coordinator(node=coordinator.id, address=coordinator.address),
        )
        gang.parts = [
            Part(index=i, node=n.id, address="", port=0, process_id=part_process_id(plan.model, gang.id, i))
            for i, n in enumerate(placement.parts)
        ]
        gangs.records[gang.id] = gang
        try:
            await self._form(gang, plan, route, local, digest, started)
        except BaseException as err:  # nothing half-applied: whatever failed, undo what was started
            undone = await self._teardown(gang, unload=True)
            del gangs.records[gang.id]
            if not isinstance(err, ShardError | WorkerUnavailable):
                raise
            message = err.message if isinstance(err, ShardError) else str(err)
            stopped = ", ".join(sorted({p.node for p in gang.parts}))
            tail = (
                f"; rolled back: stopped the parts on {stopped} and unloaded the coordinator on {gang.coordinator.node}"
            )
            if undone.unreached:
                tail += f" (not reached: {', '.join(undone.unreached)})"
            raise ShardError(
                err.status if isinstance(err, ShardError) else 502,
                err.kind if isinstance(err, ShardError) else "worker_failed",
                f"creating a gang of {plan.model} failed: {message}{tail}",
            ) from None
        gang.state = GangState.SERVING
        gang.timings["total"] = round(time.monotonic() - started, 3)
        log.info(
            "gang %s of %s serving: coordinator on %s, parts %s",
            gang.id,
            gang.model,
            gang.coordinator.node,
            gang.rpc_list(),
        )
        await gangs.emit(
            SHARD_CREATED,
            gang.model,
            {
                "gang": gang.id,
                "coordinator": gang.coordinator.node,
                "shards": gang.shards,
                "parts": [{"index": p.index, "node": p.node, "address": p.address} for p in gang.parts],
                "uploaded": gang.coordinator.uploaded,
                "seconds": gang.timings["total"],
            },
        )
        return gang

    async def _form(
        self, gang: Gang, plan: ShardPlan, route: rpc_binary.RpcRoute, local: Path | None, digest: str, started: float
    ) -> None:
        gangs = self._gangs
        commands = rpc_binary.fallback_commands(route)
        coordinator = gangs.require(gang.coordinator.node)

        async def one_part(part: Part) -> None:
            await gangs.start_part(gang, part, gangs.require(part.node), plan, commands)

        async def weights() -> None:
            if local is not None:
                t = time.monotonic()
                placed = await gangs.guard(coordinator, place_file(gangs.workers, coordinator, local, digest))
                gang.coordinator.weights, gang.coordinator.uploaded = placed.path, placed.uploaded
                gang.timings["weights"] = round(time.monotonic() - t, 3)

        results = await asyncio.gather(*(one_part(p) for p in gang.parts), weights(), return_exceptions=True)
        gang.timings["parts"] = round(time.monotonic() - started, 3)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        await gangs.start_coordinator(gang, plan)

    async def list(self) -> list[Gang]:
        """Every gang, by model and age, with its state."""
        return sorted(self._gangs.records.values(), key=lambda g: (g.model, g.created_at))

    async def delete(self, model_id: str) -> RemovedGangs:
        """Stop every gang of ``model_id``: coordinator unloaded, parts stopped."""
        records = self._gangs.records
        gangs = [g for g in records.values() if g.model == model_id]
        if not gangs:
            models = sorted({g.model for g in records.values()})
            raise not_found(
                f"model {model_id!r} has no gangs"
                + (f"; gangs exist for: {', '.join(models)}" if models else "; there are no gangs")
            )
        return await self._remove(model_id, gangs)

    async def delete_gang(self, model_id: str, gang_id: str) -> RemovedGangs:
        records = self._gangs.records
        gang = records.get(gang_id)
        if gang is None or gang.model != model_id:
            ids = sorted(g.id for g in records.values() if g.model == model_id)
            raise not_found(
                f"model {model_id!r} has no gang {gang_id!r}"
                + (f"; its gangs: {', '.join(ids)}" if ids else "; it has no gangs")
            )
        return await self._remove(model_id, [gang])

    async def _remove(self, model_id: str, gangs: builtins.list[Gang]) -> RemovedGangs:
        self._gangs.claim(model_id, "delete")
        unreached: list[str] = []
        try:
            for gang in gangs:
                gang.state = GangState.REMOVING
                undone = await self._teardown(gang, unload=True)
                unreached += undone.unreached
                self._gangs.records.pop(gang.id, None)
                await self._gangs.emit(SHARD_REMOVED, model_id, {"gang": gang.id, "unreached": undone.unreached})
        finally:
            self._gangs.release(model_id)
        return RemovedGangs(model=model_id, removed=gangs, unreached=unreached)

    async def _teardown(self, gang: Gang, *, unload: bool) -> RemovedGangs:
        """Unload the coordinator and stop every part; what could not be reached is named, never raised."""
        workers = self._gangs.workers
        unreached: list[str] = []
        source = entry.source if (entry := self._gangs.entries(gang.model)) is not None else None

        async def quietly(node_id: str, what: str, call: Callable[[NodeState], Awaitable[None]]) -> None:
            node = self._gangs.node(node_id)
            why = gone_reason(node, node_id)
            if not why and node is not None:
                try:
                    await call(node)
                    return
                except WorkerUnavailable as err:
                    why = str(err)
            unreached.append(f"{node_id}: {what}: {why}")

        def stop_part(part: Part) -> Callable[[NodeState], Awaitable[None]]:
            return lambda node: calls.stop_process(workers, node, part.process_id)

        jobs = [quietly(p.node, f"part {p.index}", stop_part(p)) for p in gang.parts]
        if unload:
            jobs.append(
                quietly(
                    gang.coordinator.node,
                    "coordinator",
                    lambda node: calls.unload_coordinator(workers, node, gang.model, source),
                )
            )
        await asyncio.gather(*jobs)
        for part in gang.parts:
            part.state = ProcessState.STOPPED
        gang.coordinator.state = ProcessState.STOPPED
        return RemovedGangs(model=gang.model, removed=[gang], unreached=unreached)

    # --- healing ---------------------------------------------------------------------

    async def heal_once(self) -> builtins.list[str]:
        """Check every gang once and re-form those that lost a part or their coordinator; what was done, in words."""
        return await self._healer.round()

    async def run_healer(self, stop: asyncio.Event, every: float = 5.0) -> None:
        """The lead runs this as a task beside the reconciler."""
        await self._healer.run(stop, every)

    # --- persistence ---------------------------------------------------------------

    def to_json(self) -> str:
        return gangs_to_json([g for g in self._gangs.records.values() if g.state is not GangState.FORMING])

    def from_json(self, text: str | bytes) -> builtins.list[Gang]:
        """Put back gangs saved by :meth:`to_json` (replacing those in memory); the healer then checks each.

        A gang saved while it was being removed is kept as ``degraded`` so the
        operator sees it and can delete it again.
        """
        gangs = gangs_from_json(text)
        for gang in gangs:
            if gang.state is GangState.REMOVING:
                gang.state, gang.detail = (
                    GangState.DEGRADED,
                    "was being removed when the leader stopped; delete it again",
                )
            elif gang.state is GangState.HEALING:
                gang.state = GangState.DEGRADED
        records = self._gangs.records
        records.clear()
        records.update((g.id, g) for g in gangs)
        return gangs
