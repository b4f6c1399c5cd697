"""What one routing decision costs the leader with 100 workers: ``opod.fleet.router.Router.pick``, in process.

The router decides from memory alone. Here its state is built through the calls the
leader makes when workers register, heartbeat and report KV-cache blocks, with the
bench's prefix policy, and each scenario times many decisions one by one:

- ``load``: no prefix to match (a short prompt, or no policy): load scoring alone;
- ``prefix, 3 holders``: a 128-block prompt whose blocks three workers hold;
- ``prefix, shared system prompt``: every worker holds the prompt's first 64 blocks (a system
  prompt in use everywhere), one worker the rest (its conversation);
- ``pin``: a prompt no worker reports, so the sticky pin's key is made from the messages;
- ``stress``: every worker holds a different number of the prompt's leading blocks, so the
  walk ends a run at each block. Prefix routing is what keeps a fleet out of this state; it
  bounds the walk's cost and is reported beside the goal, not judged by it.

A decision's time is ``pick`` alone: the request's block hashes are made before it (from the
request's tokens, by ``opod.gateway.prefix``), and the attempt after it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.fleet.affinity import AffinityTable
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.router import Decision, Router, RouteRequest, RoutingPolicy
from opod.fleet.state import Fleet
from opod.http.serving import YOUNG_COLLECTION_AT

WORKERS = 100
BLOCK_SIZE = 16
PROMPT_BLOCKS = 128
SAMPLES = 5000
GOAL_P99 = 100e-6
"""The goal: a decision costs at most 100 µs at p99 with 100 workers."""
MODEL = "sim-chat"
POLICY = RoutingPolicy(kv_weight=1.0, prefix_block_weight=1.0, prefix_affinity=True)
"""The bench's prefix policy (``bench.routing.fleet.PREFIX_POLICY``) as the router sees it."""
STRESS = "stress: every worker holds a different part"
"""The scenario reported beside the goal, not judged by it."""


@dataclass(frozen=True)
class DecisionCost:
    scenario: str
    p50: float
    p99: float
    """Seconds per decision."""
    samples: int
    judged: bool = True
    """False for the stress scenario: reported beside the goal, not judged by it."""


def _fleet(ids: list[str]) -> Fleet:
    fleet = Fleet()
    now = int(time.time())
    for i, node_id in enumerate(ids):
        fleet.register(
            nodeapi.RegisterRequest(id=node_id, address=f"10.0.{i // 250}.{i % 250 + 1}:8081", boot_id="b"),
            "t",
            nodeapi.Capabilities(engine="sim"),
        )
        load = nodeapi.EngineLoad(kv_used_pct=float(i % 90), queue_depth=i % 3, sampled_at=now)
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=[MODEL], load=load))
        fleet.get(node_id).in_flight = i % 7
    return fleet


def _time(decide, samples: int) -> tuple[float, float]:
    for _ in range(samples // 10):
        decide()
    clock = time.perf_counter_ns
    spent = []
    for _ in range(samples):
        started = clock()
        decide()
        spent.append(clock() - started)
    spent.sort()
    return spent[len(spent) // 2] / 1e9, spent[min(len(spent) - 1, int(0.99 * len(spent)))] / 1e9


def scenarios(workers: int = WORKERS) -> dict[str, Callable[[], Decision | None]]:
    """Each scenario's decision, ready to be made again and again on the same state."""
    ids = [f"w{i:03d}" for i in range(workers)]
    fleet = _fleet(ids)
    hashes = block_hashes(list(range(PROMPT_BLOCKS * BLOCK_SIZE)), BLOCK_SIZE)
    three = {ids[0], ids[workers // 3], ids[2 * workers // 3]}
    held_by_three = _index({node_id: PROMPT_BLOCKS for node_id in three}, hashes)
    shared = _index({node_id: PROMPT_BLOCKS if node_id == ids[-1] else PROMPT_BLOCKS // 2 for node_id in ids}, hashes)
    staggered = _index({node_id: i % PROMPT_BLOCKS + 1 for i, node_id in enumerate(ids)}, hashes)
    pins = AffinityTable()
    system = " ".join(f"word{i}" for i in range(1000))
    payload = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "a question"}],
    }
    by_three, by_all, by_staggered = (Router(fleet, index, pins) for index in (held_by_three, shared, staggered))
    unplaced = Router(fleet, PrefixIndex(), pins)
    return {
        "load": lambda: by_three.pick(RouteRequest(MODEL), POLICY),
        f"prefix, 3 holders of {PROMPT_BLOCKS} blocks": lambda: by_three.pick(
            RouteRequest(MODEL, hashes=hashes), POLICY
        ),
        "prefix, shared system prompt on every worker": lambda: by_all.pick(RouteRequest(MODEL, hashes=hashes), POLICY),
        "pin (no worker reports the prompt)": lambda: unplaced.pick(RouteRequest(MODEL, payload=payload), POLICY),
        STRESS: lambda: by_staggered.pick(RouteRequest(MODEL, hashes=hashes), POLICY),
    }


def _index(held: dict[str, int], hashes: list[str]) -> PrefixIndex:
    """An index where each worker reported holding that many of ``hashes``' leading blocks."""
    index = PrefixIndex()
    for node_id, blocks in held.items():
        index.apply(node_id, "b", nodeapi.KVBlocks(seq=1, block_size=BLOCK_SIZE, stored=hashes[:blocks]))
    return index


def measure(workers: int = WORKERS, samples: int = SAMPLES) -> list[DecisionCost]:
    """p50 and p99 of one decision in each scenario, with the collector tuned as the leader tunes it."""
    cases = scenarios(workers)
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_AT, *thresholds[1:])
    try:
        out = []
        for scenario, decide in cases.items():
            p50, p99 = _time(decide, samples)
            out.append(DecisionCost(scenario, p50, p99, samples, judged=scenario != STRESS))
        return out
    finally:
        gc.set_threshold(*thresholds)
