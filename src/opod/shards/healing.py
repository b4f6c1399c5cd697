"""Healing: notice a gang that lost a part or its coordinator, and re-form it.

Each round asks every gang's workers about its processes (``/v1/process/get``).
A part is lost when its worker is gone (unknown, said goodbye, no heartbeat
within the liveness limit, or did not answer ``miss_limit`` checks in a row)
or when its process ended (failed, crash loop, stopped, or unknown to a worker
that restarted). A crash the worker is already restarting is left to it.

Re-forming: each lost part is started again, on its own worker when that is
still live (only the process failed), else on another live worker holding no
part of the gang; then the coordinator is restarted with the new RPC list
(llama-server reads ``--rpc`` only at start), moved to another worker when
its own is gone. A heal that fails stops what it started, leaves the gang
``degraded`` with the reason, and is tried again next round;
``shard.heal_failed`` is emitted once per distinct reason (counts and ages
aside), not every round.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from opod.contract import nodeapi
from opod.engines import rpc_binary
from opod.http.nodeclient import WorkerUnavailable
from opod.shards import calls
from opod.shards.distribute import checked_digest, leader_file, place_file
from opod.shards.errors import ShardError
from opod.shards.gangs import Gangs
from opod.shards.planning import ShardPlan, choose_coordinator, gone_reason, replacement
from opod.shards.records import Gang, GangState, ProcessState

log = logging.getLogger("opod.shards")

SHARD_HEALED = "shard.healed"
SHARD_HEAL_FAILED = "shard.heal_failed"

ENDED = (nodeapi.ProcessStatus.FAILED, nodeapi.ProcessStatus.CRASHLOOP, nodeapi.ProcessStatus.STOPPED)


@dataclass(slots=True)
class Findings:
    lost: dict[int, str] = field(default_factory=dict)
    """Part index → why it is lost."""
    gone: dict[str, str] = field(default_factory=dict)
    """Worker id → why the worker itself is gone."""
    coordinator: str = ""
    """Why the coordinator must be started again; ``""`` = it is fine."""
    coordinator_gone: bool = False

    def healthy(self) -> bool:
        return not self.lost and not self.coordinator


def _cause(err: WorkerUnavailable) -> str:
    cause = err.__cause__
    if isinstance(cause, aiohttp.ClientConnectorError):
        return "could not connect"
    if isinstance(cause, TimeoutError):
        return "timed out"
    return str(cause or err)[:120]


def _same(a: str, b: str) -> bool:
    """Two failure reasons alike but for counts and ages ("2s ago", "3 checks"): one event is enough."""
    return re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b)


def _reasons(found: Findings) -> list[str]:
    out = [f"part {i}: {why}" for i, why in sorted(found.lost.items())]
    if found.coordinator:
        out.append(found.coordinator)
    return out


class Healer:
    """Checks every gang each round and re-forms those that lost a part or their coordinator.

    ``miss_limit``: checks in a row a live worker may leave unanswered before its parts count as lost.
    """

    def __init__(self, gangs: Gangs, miss_limit: int = 2) -> None:
        self.gangs = gangs
        self.miss_limit = miss_limit
        self._misses: dict[tuple[str, str, str], int] = {}
        """(gang id, node id, process id) → checks in a row the worker did not answer about that process."""

    async def round(self) -> list[str]:
        """One pass over every gang; what was done, in words."""
        gangs = self.gangs
        for key in [k for k in self._misses if k[0] not in gangs.records]:
            del self._misses[key]  # the gang was removed
        said = []
        for gang in list(gangs.records.values()):
            if gang.state in (GangState.FORMING, GangState.REMOVING) or gangs.busy(gang.model):
                continue
            found = await self.check(gang)
            if found.healthy():
                if gang.state is GangState.DEGRADED:
                    gang.state, gang.detail = GangState.SERVING, ""
                continue
            if gangs.busy(gang.model) or gang.id not in gangs.records:
                continue  # a create or delete began while the check ran
            gangs.claim(gang.model, "heal")
            try:
                said.append(await self.heal(gang, found))
            finally:
                gangs.release(gang.model)
        return said

    async def _probe(self, gang: Gang, node_id: str, process_id: str) -> tuple[str, str]:
        """(why the worker is gone, why the process is lost); both ``""`` when fine or not yet judged."""
        node = self.gangs.node(node_id)
        why = gone_reason(node, node_id)
        if why or node is None:
            return why, ""
        key = (gang.id, node_id, process_id)
        try:
            info = await calls.get_process(self.gangs.workers, node, process_id, timeout=5)
        except WorkerUnavailable as err:
            self.gangs.unreachable(node_id, str(err))
            misses = self._misses[key] = self._misses.get(key, 0) + 1
            if misses >= self.miss_limit:
                return (
                    f"worker {node_id} at {node.address} did not answer {self.miss_limit} checks in a row ({_cause(err)})",
                    "",
                )
            return "", ""
        self._misses.pop(key, None)
        if info is None:
            return "", f"its process is no longer on {node_id} (the worker restarted?)"
        if info.status in ENDED:
            return (
                "",
                f"its process on {node_id} {info.status}: {rpc_binary.describe_exit(info.exit_err or 'no reason given')}",
            )
        return "", ""

    async def check(self, gang: Gang) -> Findings:
        found = Findings()
        coordinator = gang.coordinator
        probes = [self._probe(gang, p.node, p.process_id) for p in gang.parts]
        probes.append(self._probe(gang, coordinator.node, calls.coordinator_process_id(gang.model)))
        results = await asyncio.gather(*probes)
        for part, (gone, lost) in zip(gang.parts, results[:-1]):
            if gone:
                found.gone[part.node] = gone
            if gone or lost:
                found.lost[part.index] = gone or lost
        gone, lost = results[-1]
        if not gone and coordinator.node in found.gone:
            gone = found.gone[coordinator.node]
        node = self.gangs.node(coordinator.node)
        if gone:
            found.gone[coordinator.node] = gone
            found.coordinator, found.coordinator_gone = f"the coordinator's {gone}", True
            for part in gang.parts:  # one verdict per worker: a part beside a gone coordinator is gone too
                if part.node == coordinator.node:
                    found.lost.setdefault(part.index, gone)
        elif lost:
            found.coordinator = f"the coordinator: {lost}"
        elif node is not None and gang.model in node.load_errors:
            found.coordinator = f"the coordinator failed: {node.load_errors[gang.model]}"
        return found

    async def heal(self, gang: Gang, found: Findings) -> str:
        """Re-form ``gang``; the record changes only when it succeeds (apart from state and reasons)."""
        gangs = self.gangs
        started = time.monotonic()
        gang.state = GangState.HEALING
        trial = gang.model_copy(deep=True)
        attempted: list[tuple[str, str]] = []
        moves: list[dict[str, int | str]] = []
        coordinator_from = gang.coordinator.node
        try:
            plan = gangs.plan(gang)
            commands = rpc_binary.fallback_commands(gangs.route())
            for index in sorted(found.lost):
                part = next(p for p in trial.parts if p.index == index)
                node = replacement(trial, index, gangs.nodes(), exclude=dict(found.gone), suspect=gangs.suspect())
                old = gangs.node(part.node)
                if part.node not in found.gone and old is not None:
                    try:  # clear a failed process before its id (and maybe its port) is used again
                        await calls.stop_process(gangs.workers, old, part.process_id)
                    except WorkerUnavailable:
                        pass
                moves.append({"index": index, "from": part.node, "to": node.id, "why": found.lost[index]})
                attempted.append((node.id, part.process_id))
                await gangs.start_part(trial, part, node, plan, commands)
            trial.timings = {"parts": round(time.monotonic() - started, 3)}
            await self._restart_coordinator(trial, found, plan)
        except BaseException as err:  # nothing half-applied: undo what this attempt started, whatever stopped it
            await self._undo(attempted)
            if not isinstance(err, ShardError | WorkerUnavailable):
                gang.state, gang.detail = GangState.DEGRADED, f"a heal stopped before it ended: {err!r}"
                raise
            reason = err.message if isinstance(err, ShardError) else str(err)
            return await self._failed(
                gang, found, reason, coordinator_down=trial.coordinator.state is not ProcessState.RUNNING
            )
        now = datetime.now(UTC)
        trial.state, trial.heals, trial.healed_at = GangState.SERVING, gang.heals + 1, now
        words = [f"part {m['index']} {m['from']} → {m['to']}" for m in moves]
        if trial.coordinator.node != coordinator_from:
            words.append(f"coordinator {coordinator_from} → {trial.coordinator.node}")
        trial.detail = "healed: " + (", ".join(words) or "coordinator restarted") + f" ({'; '.join(_reasons(found))})"
        trial.timings["total"] = round(time.monotonic() - started, 3)
        for name in Gang.model_fields:  # keep the record's identity: callers may hold it
            setattr(gang, name, getattr(trial, name))
        for key in [k for k in self._misses if k[0] == gang.id]:
            del self._misses[key]
        await gangs.emit(
            SHARD_HEALED,
            gang.model,
            {
                "gang": gang.id,
                "replaced": moves,
                "coordinator": gang.coordinator.node,
                "coordinator_moved": gang.coordinator.node != coordinator_from,
                "seconds": gang.timings["total"],
            },
        )
        return f"gang {gang.id} of {gang.model}: {gang.detail}"

    async def _restart_coordinator(self, trial: Gang, found: Findings, plan: ShardPlan) -> None:
        gangs = self.gangs
        coordinator = trial.coordinator
        source = plan.entry.source
        coordinator.state = ProcessState.STARTING  # from here on the old coordinator is stopped or gone
        if found.coordinator_gone:
            busy = {g.coordinator.node for g in gangs.records.values() if g.model == trial.model and g.id != trial.id}
            nodes = [n for n in gangs.nodes() if n.id not in found.gone]
            node = choose_coordinator(
                trial.model,
                nodes,
                pinned=gangs.coordinator_node,
                local_node=gangs.local_node,
                busy=busy,
                suspect=gangs.suspect(),
            )
            coordinator.node, coordinator.address, coordinator.weights, coordinator.uploaded = (
                node.id,
                node.address,
                "",
                False,
            )
            local = leader_file(trial.model, source)
            if local is not None:
                digest = await checked_digest(trial.model, local, source, gangs.digests)
                placed = await gangs.guard(node, place_file(gangs.workers, node, local, digest))
                coordinator.weights, coordinator.uploaded = placed.path, placed.uploaded
                trial.timings["weights"] = round(placed.seconds, 3)
        else:
            known = gangs.node(coordinator.node)
            if known is None:
                raise ShardError(502, "worker_failed", f"worker {coordinator.node} left the fleet")
            t = time.monotonic()
            await gangs.guard(known, calls.unload_coordinator(gangs.workers, known, trial.model, source))
            trial.timings["unload"] = round(time.monotonic() - t, 3)
        await gangs.start_coordinator(trial, plan)

    async def _undo(self, attempted: list[tuple[str, str]]) -> None:
        for node_id, process_id in attempted:
            node = self.gangs.node(node_id)
            if node is None or gone_reason(node, node_id):
                continue
            try:
                await calls.stop_process(self.gangs.workers, node, process_id)
            except WorkerUnavailable:
                pass

    async def _failed(self, gang: Gang, found: Findings, reason: str, *, coordinator_down: bool) -> str:
        for part in gang.parts:
            if part.index in found.lost:
                part.state, part.detail = ProcessState.LOST, found.lost[part.index]
        if found.coordinator or coordinator_down:
            gang.coordinator.state = ProcessState.LOST
            gang.coordinator.detail = (
                found.coordinator or "stopped to take the new RPC list, not started again: " + reason
            )
        first = not _same(gang.detail, reason)
        gang.state, gang.detail = GangState.DEGRADED, reason
        if first:
            await self.gangs.emit(
                SHARD_HEAL_FAILED, gang.model, {"gang": gang.id, "reason": reason, "lost": _reasons(found)}
            )
        return f"gang {gang.id} of {gang.model}: heal failed: {reason}"

    async def run(self, stop: asyncio.Event, every: float = 5.0) -> None:
        """A round every ``every`` seconds until ``stop`` is set; the lead runs this beside the reconciler."""
        while not stop.is_set():
            try:
                await self.round()
            except Exception:  # one bad round must not end healing
                log.exception("shard heal round failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except TimeoutError:
                pass
