"""``GET /loadz``: the load an autoscaler reads, computed from live worker samples and the gateway's counters.

Every field of the contract's ``Load``. ``kv_busy_workers`` is always written
(a scaler reads it by path); fields the leader cannot know are left out, never
written as a fake zero.
"""

from __future__ import annotations

import time

from opod.contract import adminapi, nodeapi
from opod.fleet.liveness import takes_new_work
from opod.fleet.state import Fleet, NodeState
from opod.gateway.stats import GatewayStats

SAMPLE_MAX_AGE = 30.0
"""A worker's sample older than this is not counted as reporting."""


def _holders(fleet: Fleet, model: str) -> list[NodeState]:
    if model:
        return list(fleet.holders(model))
    return [n for n in fleet if n.loaded_models]


def compute(fleet: Fleet, stats: GatewayStats, plan: adminapi.PlanSnapshot | None = None,
            prefix_index: adminapi.PrefixIndex | None = None) -> adminapi.Load:
    now_wall, now = time.time(), time.monotonic()
    model = plan.model if plan is not None else ""
    holders = _holders(fleet, model)
    live = [n for n in holders if takes_new_work(n, now)[0]]
    reporting = [n for n in live if n.load is not None and now_wall - n.load.sampled_at < SAMPLE_MAX_AGE]
    unhealthy = [n for n in holders if n.engine is not None and n.engine.word in (nodeapi.EngineStateWord.CRASH_LOOPING, nodeapi.EngineStateWord.STOPPED)]
    p50, p95 = stats.ttft_percentiles()
    kv = [n.load.kv_used_pct for n in reporting]  # type: ignore[union-attr]
    hits = [n.load.prefix_hit_pct for n in reporting]  # type: ignore[union-attr]
    load = adminapi.Load(
        plan_revision=plan.revision if plan is not None else 0,
        plan_model=model,
        in_flight=max(stats.in_flight, 0),
        rpm_1m=stats.requests.total(now_wall),
        unavailable_1m=stats.unavailable.total(now_wall),
        last_request_unix=stats.last_request_unix,
        ts=int(now_wall),
        kv_used_pct=max(kv) if kv else 0.0,
        queue_depth=sum(n.load.queue_depth for n in reporting),  # type: ignore[union-attr]
        tokens_per_s=sum(n.load.tokens_per_s for n in reporting),  # type: ignore[union-attr]
        prefix_hit_pct=sum(hits) / len(hits) if hits else 0.0,
        workers=len(live),
        reporting=len(reporting),
        # "How many workers' worth of KV cache is in use": the mean fraction times the count.
        kv_busy_workers=round(sum(kv) / 100.0, 4) if kv else 0.0,
        prefix_index=prefix_index,
        ttft_p50_ms=p50,
        ttft_p95_ms=p95,
        engines_unhealthy=len(unhealthy),
        engine_issue=_worst(unhealthy),
    )
    return load


def _worst(nodes: list[NodeState]) -> str:
    looping = [n for n in nodes if n.engine is not None and n.engine.word is nodeapi.EngineStateWord.CRASH_LOOPING]
    chosen = (looping or nodes)[:1]
    if not chosen or chosen[0].engine is None:
        return ""
    node = chosen[0]
    return f"{node.id}: {node.engine.state}" + (f": {node.engine.detail}" if node.engine.detail else "")
