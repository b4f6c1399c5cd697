"""What a gang needs (its plan) and where it goes (placement): pure functions over the fleet in memory.

Every refusal names the numbers: how many workers are needed, which ones
count, and why each other one does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Set
from dataclasses import dataclass

from opod.contract.catalog import Entry
from opod.fleet.liveness import HEARTBEAT_MAX_AGE, takes_new_work
from opod.fleet.state import NodeState
from opod.shards.errors import bad_request, conflict, not_found
from opod.shards.records import MAX_SHARDS, Gang

DEFAULT_SHARDS = 2
DEFAULT_RPC_PORT_BASE = 50052
PORT_TRIES = 4
"""Ports tried per part on one worker: ``base + index``, then one gang-width further each time."""
COORDINATOR_ENGINE = "llamacpp"
LOCAL = "local"
"""``OPOD_COORDINATOR_NODE=local``: the worker that runs inside the leader's own process."""


@dataclass(frozen=True, slots=True)
class ShardPlan:
    model: str
    shards: int
    port_base: int
    entry: Entry

    def ports(self, index: int) -> list[int]:
        """The ports part ``index`` may take, in the order they are tried."""
        return [self.port_base + index + k * self.shards for k in range(PORT_TRIES)]


def plan_for(model_id: str, entry: Entry | None, shards: int | None) -> ShardPlan:
    """The plan for a gang of ``model_id``, or a refusal saying what is wrong and what to do."""
    if entry is None:
        raise not_found(
            f"model {model_id!r} is not in the catalog; add its catalog entry (with a sharding block) "
            "or add the GGUF with `opod model add --gguf PATH`"
        )
    sharding = entry.sharding
    if sharding.engine and sharding.engine != COORDINATOR_ENGINE:
        raise bad_request(
            f"model {model_id!r} asks for a {sharding.engine!r} gang (catalog sharding.engine); "
            f"only llama.cpp RPC gangs ({COORDINATOR_ENGINE}) are made here"
        )
    source = entry.source
    if source.type == "ollama" and not source.repo:
        raise bad_request(
            f"model {model_id!r} comes from Ollama ({source.ollama_name}) with no GGUF repo; llama.cpp cannot load an Ollama tag"
        )
    if shards is None:
        shards = sharding.default_shards or DEFAULT_SHARDS
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise bad_request(f"shards must be a whole number from 1 to {MAX_SHARDS}, got {shards!r}")
    base = sharding.rpc_port_base or DEFAULT_RPC_PORT_BASE
    highest = base + shards - 1 + (PORT_TRIES - 1) * shards
    if base < 1024 or highest > 65535:
        raise bad_request(
            f"model {model_id!r}: rpc_port_base {base} with {shards} parts needs ports {base}–{highest}; "
            "set sharding.rpc_port_base so that range lies within 1024–65535"
        )
    return ShardPlan(model=model_id, shards=shards, port_base=base, entry=entry)


# --- the fleet as placement sees it --------------------------------------------


def memory_rank(node: NodeState) -> tuple[int, int, str]:
    """Sort key, most memory first: GPU memory, then host RAM, then node id (stable ties)."""
    vram = sum(g.vram_gb for g in node.hardware.gpus or [])
    return (-vram, -(node.hardware.ram_gb or 0), node.id)


def gone_reason(node: NodeState | None, node_id: str, now: float | None = None) -> str:
    """Why a worker holding a gang process counts as gone without asking it, or ``""``.

    Narrower than "takes no new work": a drained or sleeping worker still runs
    the part it has. A goodbye is not taken at its word either: the fleet also
    reads "engine stopped, nothing loaded" as one, which is what a worker whose
    only engine (a coordinator) failed says; the worker is asked instead, and
    one that really stopped does not answer. A node restored from the store
    that has not sent a heartbeat yet (``last_heartbeat == 0``) is not judged
    by age either.
    """
    if node is None:
        return f"worker {node_id} is no longer known to the leader"
    now = time.monotonic() if now is None else now
    age = now - node.last_heartbeat
    if node.last_heartbeat > 0 and age > HEARTBEAT_MAX_AGE:
        return f"worker {node_id} sent no heartbeat for {age:.0f}s (limit {HEARTBEAT_MAX_AGE:.0f}s)"
    return ""


def usable(node: NodeState, now: float, suspect: dict[str, str]) -> tuple[bool, str]:
    """The one liveness rule, plus the leader's own recent failure to reach the worker."""
    ok, why = takes_new_work(node, now)
    if ok and node.id in suspect:
        return False, suspect[node.id]
    return ok, why


def _not_counted(nodes: Iterable[NodeState], counted: set[str], now: float, suspect: dict[str, str]) -> str:
    parts = [f"{n.id} ({usable(n, now, suspect)[1] or 'not usable'})" for n in nodes if n.id not in counted]
    return "; not counted: " + ", ".join(parts) if parts else ""


@dataclass(frozen=True, slots=True)
class Placement:
    coordinator: NodeState
    parts: list[NodeState]
    """One distinct worker per part, in part index order."""


def _coordinator_problem(node: NodeState, model: str, busy: Set[str], now: float, suspect: dict[str, str]) -> str:
    ok, why = usable(node, now, suspect)
    if not ok:
        return why
    if node.engine_id and node.engine_id != COORDINATOR_ENGINE:
        return f"runs the {node.engine_id} engine, a coordinator needs {COORDINATOR_ENGINE}"
    if node.id in busy:
        return f"already coordinates a gang of {model}"
    if model in node.loaded_models or model in node.load_progress:
        return f"already serves {model} on its own (unload it there first)"
    return ""


def choose_coordinator(
    model: str,
    nodes: list[NodeState],
    *,
    pinned: str | None = None,
    local_node: str | None = None,
    busy: Set[str] = frozenset(),
    suspect: dict[str, str] | None = None,
    now: float | None = None,
) -> NodeState:
    """The worker to run the coordinator: ``pinned`` (``OPOD_COORDINATOR_NODE``; ``local`` = ``local_node``),
    else the live llama.cpp worker with the most memory. ``busy`` = workers already coordinating this model
    (one engine per model per worker)."""
    now = time.monotonic() if now is None else now
    suspect = suspect or {}
    if pinned:
        wanted = local_node if pinned == LOCAL else pinned
        if wanted is None:
            raise conflict(
                f"OPOD_COORDINATOR_NODE is {LOCAL!r} but this leader runs no worker of its own (opod up --no-worker); name a node id or unset it"
            )
        node = next((n for n in nodes if n.id == wanted), None)
        if node is None:
            known = ", ".join(n.id for n in nodes) or "none"
            raise conflict(
                f"OPOD_COORDINATOR_NODE names {wanted!r}, which is not a worker of this leader (known: {known}); name one of them or unset it"
            )
        problem = _coordinator_problem(node, model, busy, now, suspect)
        if problem:
            raise conflict(f"OPOD_COORDINATOR_NODE names {wanted!r}, which cannot coordinate now: {problem}")
        return node
    ranked = sorted(nodes, key=memory_rank)
    problems = {n.id: _coordinator_problem(n, model, busy, now, suspect) for n in ranked}
    fit = [n for n in ranked if not problems[n.id]]
    if not fit:
        detail = ", ".join(f"{n.id} ({problems[n.id]})" for n in ranked) or "no workers at all"
        raise conflict(
            f"no worker can coordinate a gang of {model}: {detail}; join a worker with `opod join --engine {COORDINATOR_ENGINE}`"
        )
    return fit[0]


def place(
    plan: ShardPlan,
    nodes: list[NodeState],
    *,
    pinned: str | None = None,
    local_node: str | None = None,
    gangs: Iterable[Gang] = (),
    suspect: dict[str, str] | None = None,
    now: float | None = None,
) -> Placement:
    """Choose the coordinator's worker and one distinct live worker per part."""
    now = time.monotonic() if now is None else now
    suspect = suspect or {}
    live = sorted((n for n in nodes if usable(n, now, suspect)[0]), key=memory_rank)
    if len(live) < plan.shards:
        names = ", ".join(n.id for n in live) or "none"
        raise conflict(
            f"need {plan.shards} workers, have {len(live)}: {names}{_not_counted(nodes, {n.id for n in live}, now, suspect)}; "
            f"join more workers (`opod join`) or ask for fewer shards"
        )
    busy = {g.coordinator.node for g in gangs if g.model == plan.model}
    coordinator = choose_coordinator(
        plan.model, nodes, pinned=pinned, local_node=local_node, busy=busy, suspect=suspect, now=now
    )
    # The coordinator's own machine takes part 0 when it can: that part is reached over loopback.
    order = ([coordinator] if coordinator in live else []) + [n for n in live if n is not coordinator]
    return Placement(coordinator=coordinator, parts=order[: plan.shards])


def replacement(
    gang: Gang,
    index: int,
    nodes: list[NodeState],
    *,
    exclude: dict[str, str],
    suspect: dict[str, str] | None = None,
    now: float | None = None,
) -> NodeState:
    """A live worker for part ``index`` of ``gang``: not holding another of its parts, not in ``exclude`` (id → why).

    The part's own worker comes first when it is still usable (its process failed, not the machine).
    """
    now = time.monotonic() if now is None else now
    holders = {p.node: p.index for p in gang.parts if p.index != index}
    reasons: dict[str, str] = {}
    fit: list[NodeState] = []
    for node in sorted(nodes, key=memory_rank):
        ok, why = usable(node, now, suspect or {})
        if node.id in exclude:
            reasons[node.id] = exclude[node.id]
        elif node.id in holders:
            reasons[node.id] = f"holds part {holders[node.id]}"
        elif not ok:
            reasons[node.id] = why
        else:
            fit.append(node)
    if not fit:
        detail = ", ".join(f"{nid} ({why})" for nid, why in reasons.items()) or "no workers at all"
        raise conflict(
            f"part {index} of gang {gang.id} ({gang.model}) has no worker to move to: {len(nodes)} known, "
            f"0 usable: {detail}; join another worker (`opod join`)"
        )
    current = next((p.node for p in gang.parts if p.index == index), None)
    fit.sort(key=lambda n: n.id != current)
    return fit[0]
