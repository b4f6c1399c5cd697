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


def compute(
    fleet: Fleet,
    stats: GatewayStats,
    plan: adminapi.PlanSnapshot | None = None,
    prefix_index: adminapi.PrefixIndex | None = None,
) -> adminapi.Load:
    now_wall, now = time.time(), time.monotonic()
    model = plan.model if plan is not None else ""
    holders = _holders(fleet, model)
    # With a plan, its model's own health counts (a cooling-down engine is not live for it).
    live = fleet.workers_for(model, now) if model else [n for n in holders if takes_new_work(n, now)[0]]
    reporting = [n.load for n in live if n.load is not None and now_wall - n.load.sampled_at < SAMPLE_MAX_AGE]
    unhealthy = [
        n
        for n in holders
        if n.engine is not None
        and n.engine.word in (nodeapi.EngineStateWord.CRASH_LOOPING, nodeapi.EngineStateWord.STOPPED)
    ]
    p50, p95 = stats.ttft_percentiles()
    kv = [sample.kv_used_pct for sample in reporting]
    hits = [sample.prefix_hit_pct for sample in reporting]
    load = adminapi.Load(
        plan_revision=plan.revision if plan is not None else 0,
        plan_model=model,
        in_flight=max(stats.in_flight, 0),
        rpm_1m=stats.requests.total(now_wall),
        unavailable_1m=stats.unavailable.total(now_wall),
        last_request_unix=stats.last_request_unix,
        ts=int(now_wall),
        kv_used_pct=max(kv) if kv else 0.0,
        queue_depth=sum(sample.queue_depth for sample in reporting),
        tokens_per_s=sum(sample.tokens_per_s for sample in reporting),
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
    engine = chosen[0].engine if chosen else None
    if engine is None:
        return ""
    return f"{chosen[0].id}: {engine.state}" + (f": {engine.detail}" if engine.detail else "")
