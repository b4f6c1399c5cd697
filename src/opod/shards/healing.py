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
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import aiohttp

from opod.contract import nodeapi
from opod.engines import rpc_binary
from opod.http.nodeclient import WorkerUnavailable
from opod.shards import calls
from opod.shards.distribute import checked_digest, leader_file, place_file
from opod.shards.errors import ShardError
from opod.shards.planning import choose_coordinator, gone_reason, replacement
from opod.shards.records import Gang, GangState, ProcessState

if TYPE_CHECKING:
    from opod.shards.manager import ShardManager

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


async def _probe(manager: ShardManager, gang: Gang, node_id: str, process_id: str) -> tuple[str, str]:
    """(why the worker is gone, why the process is lost); both ``""`` when fine or not yet judged."""
    node = manager.node(node_id)
    why = gone_reason(node, node_id)
    if why or node is None:
        return why, ""
    key = (gang.id, node_id, process_id)
    try:
        info = await calls.get_process(manager.workers, node, process_id, timeout=5)
    except WorkerUnavailable as err:
        manager.unreachable(node_id, str(err))
        misses = manager.misses[key] = manager.misses.get(key, 0) + 1
        if misses >= manager.miss_limit:
            return f"worker {node_id} at {node.address} did not answer {manager.miss_limit} checks in a row ({_cause(err)})", ""
        return "", ""
    manager.misses.pop(key, None)
    if info is None:
        return "", f"its process is no longer on {node_id} (the worker restarted?)"
    if info.status in ENDED:
        return "", f"its process on {node_id} {info.status}: {rpc_binary.describe_exit(info.exit_err or 'no reason given')}"
    return "", ""


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


async def check(manager: ShardManager, gang: Gang) -> Findings:
    found = Findings()
    coordinator = gang.coordinator
    probes = [_probe(manager, gang, p.node, p.process_id) for p in gang.parts]
    probes.append(_probe(manager, gang, coordinator.node, calls.coordinator_process_id(gang.model)))
    results = await asyncio.gather(*probes)
    for part, (gone, lost) in zip(gang.parts, results[:-1]):
        if gone:
            found.gone[part.node] = gone
        if gone or lost:
            found.lost[part.index] = gone or lost
    gone, lost = results[-1]
    if not gone and coordinator.node in found.gone:
        gone = found.gone[coordinator.node]
    node = manager.node(coordinator.node)
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


async def heal_round(manager: ShardManager) -> list[str]:
    said = []
    for gang in list(manager.gangs.values()):
        if gang.state in (GangState.FORMING, GangState.REMOVING) or gang.model in manager.busy:
            continue
        found = await check(manager, gang)
        if found.healthy():
            if gang.state is GangState.DEGRADED:
                gang.state, gang.detail = GangState.SERVING, ""
            continue
        if gang.model in manager.busy or gang.id not in manager.gangs:
            continue  # a create or delete began while the check ran
        manager.busy[gang.model] = "heal"
        try:
            said.append(await heal(manager, gang, found))
        finally:
            manager.busy.pop(gang.model, None)
    return said


async def heal(manager: ShardManager, gang: Gang, found: Findings) -> str:
    """Re-form ``gang``; the record changes only when it succeeds (apart from state and reasons)."""
    started = time.monotonic()
    gang.state = GangState.HEALING
    trial = gang.model_copy(deep=True)
    attempted: list[tuple[str, str]] = []
    moves: list[dict] = []
    coordinator_from = gang.coordinator.node
    try:
        plan = manager.plan(gang)
        commands = rpc_binary.fallback_commands(manager.route())
        for index in sorted(found.lost):
            part = next(p for p in trial.parts if p.index == index)
            node = replacement(trial, index, list(manager.fleet), exclude=dict(found.gone), suspect=manager.suspect())
            old = manager.node(part.node)
            if part.node not in found.gone and old is not None:
                try:  # clear a failed process before its id (and maybe its port) is used again
                    await calls.stop_process(manager.workers, old, part.process_id)
                except WorkerUnavailable:
                    pass
            moves.append({"index": index, "from": part.node, "to": node.id, "why": found.lost[index]})
            attempted.append((node.id, part.process_id))
            await manager.start_part(trial, part, node, plan, commands)
        trial.timings = {"parts": round(time.monotonic() - started, 3)}
        await _restart_coordinator(manager, trial, found, plan)
    except BaseException as err:  # nothing half-applied: undo what this attempt started, whatever stopped it
        await _undo(manager, attempted)
        if not isinstance(err, ShardError | WorkerUnavailable):
            gang.state, gang.detail = GangState.DEGRADED, f"a heal stopped before it ended: {err!r}"
            raise
        reason = err.message if isinstance(err, ShardError) else str(err)
        return await _failed(manager, gang, found, reason, coordinator_down=trial.coordinator.state is not ProcessState.RUNNING)
    now = datetime.now(UTC)
    trial.state, trial.heals, trial.healed_at = GangState.SERVING, gang.heals + 1, now
    words = [f"part {m['index']} {m['from']} → {m['to']}" for m in moves]
    if trial.coordinator.node != coordinator_from:
        words.append(f"coordinator {coordinator_from} → {trial.coordinator.node}")
    trial.detail = "healed: " + (", ".join(words) or "coordinator restarted") + f" ({'; '.join(_reasons(found))})"
    trial.timings["total"] = round(time.monotonic() - started, 3)
    for name in Gang.model_fields:  # keep the record's identity: callers may hold it
        setattr(gang, name, getattr(trial, name))
    for key in [k for k in manager.misses if k[0] == gang.id]:
        del manager.misses[key]
    await manager.emit(SHARD_HEALED, gang.model, {
        "gang": gang.id, "replaced": moves, "coordinator": gang.coordinator.node,
        "coordinator_moved": gang.coordinator.node != coordinator_from, "seconds": gang.timings["total"],
    })
    return f"gang {gang.id} of {gang.model}: {gang.detail}"


async def _restart_coordinator(manager: ShardManager, trial: Gang, found: Findings, plan) -> None:
    coordinator = trial.coordinator
    source = plan.entry.source
    coordinator.state = ProcessState.STARTING  # from here on the old coordinator is stopped or gone
    if found.coordinator_gone:
        busy = {g.coordinator.node for g in manager.gangs.values() if g.model == trial.model and g.id != trial.id}
        nodes = [n for n in manager.fleet if n.id not in found.gone]
        node = choose_coordinator(trial.model, nodes, pinned=manager.coordinator_node, local_node=manager.local_node,
                                  busy=busy, suspect=manager.suspect())
        coordinator.node, coordinator.address, coordinator.weights, coordinator.uploaded = node.id, node.address, "", False
        local = leader_file(trial.model, source)
        if local is not None:
            digest = await checked_digest(trial.model, local, source, manager.digests)
            placed = await manager._guard(node, place_file(manager.workers, node, local, digest))
            coordinator.weights, coordinator.uploaded = placed.path, placed.uploaded
            trial.timings["weights"] = round(placed.seconds, 3)
    else:
        node = manager.node(coordinator.node)
        if node is None:
            raise ShardError(502, "worker_failed", f"worker {coordinator.node} left the fleet")
        t = time.monotonic()
        await manager._guard(node, calls.unload_coordinator(manager.workers, node, trial.model, source))
        trial.timings["unload"] = round(time.monotonic() - t, 3)
    await manager.start_coordinator(trial, plan)


async def _undo(manager: ShardManager, attempted: list[tuple[str, str]]) -> None:
    for node_id, process_id in attempted:
        node = manager.node(node_id)
        if node is None or gone_reason(node, node_id):
            continue
        try:
            await calls.stop_process(manager.workers, node, process_id)
        except WorkerUnavailable:
            pass


def _reasons(found: Findings) -> list[str]:
    out = [f"part {i}: {why}" for i, why in sorted(found.lost.items())]
    if found.coordinator:
        out.append(found.coordinator)
    return out


async def _failed(manager: ShardManager, gang: Gang, found: Findings, reason: str, *, coordinator_down: bool) -> str:
    for part in gang.parts:
        if part.index in found.lost:
            part.state, part.detail = ProcessState.LOST, found.lost[part.index]
    if found.coordinator or coordinator_down:
        gang.coordinator.state = ProcessState.LOST
        gang.coordinator.detail = found.coordinator or "stopped to take the new RPC list, not started again: " + reason
    first = not _same(gang.detail, reason)
    gang.state, gang.detail = GangState.DEGRADED, reason
    if first:
        await manager.emit(SHARD_HEAL_FAILED, gang.model, {"gang": gang.id, "reason": reason, "lost": _reasons(found)})
    return f"gang {gang.id} of {gang.model}: heal failed: {reason}"
