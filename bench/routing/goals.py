"""The lead's goals for opod's routing, checked against one run's numbers.

Each goal names the row of the table it belongs to, says its target in words
with the measured threshold filled in, and gives a verdict: met, missed, or
unknown (a path it compares with did not run, or measured nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.routing.decision import GOAL_P99, WORKERS
from bench.routing.runner import PathResult, RunResult

HALF = 0.5
"""The open-loop load the latency goals are judged at: half the direct capacity."""


@dataclass(frozen=True)
class Goal:
    row: str
    target: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return {True: "met", False: "missed", None: "unknown"}[self.met]


def _num(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def half_load(run: RunResult) -> float | None:
    """The offered rate closest to half the direct capacity."""
    fractions = run.settings.loads
    if not run.offered:
        return None
    best = min(range(len(fractions)), key=lambda i: abs(fractions[i] - HALF))
    return run.offered[best] if best < len(run.offered) else None


def added(run: RunResult, path: PathResult, rate: float | None, q: int) -> float:
    """Latency (s) the path adds over direct at this offered rate, percentile ``q`` (50, 90 or 99).

    Against the direct runs made in turns with this path when there are some (the goals' load),
    else against the direct path's own column.
    """
    direct = run.path("direct")
    if rate is None or rate not in path.open:
        return math.nan
    baseline = path.paired.get(rate) or (direct.open.get(rate) if direct is not None else None)
    if baseline is None:
        return math.nan
    return getattr(path.open[rate], f"p{q}") - getattr(baseline, f"p{q}")


def _ran(run: RunResult, key: str) -> PathResult | None:
    path = run.path(key)
    return path if path is not None and path.ran else None


def _vllm_router_name(path: PathResult | None) -> str:
    """The goal compares with kv_aware; a row that fell back to cache_aware says so."""
    return (
        "vllm-router kv_aware"
        if path is None or path.label.endswith("(kv_aware)")
        else "vllm-router (cache_aware: kv_aware could not run)"
    )


def check(run: RunResult) -> list[Goal]:
    opod = _ran(run, "opod")
    rr = _ran(run, "opod-rr")
    goals: list[Goal] = []
    rate = half_load(run)

    def verdict(ok: bool, *inputs: float | None) -> bool | None:
        return ok if all(_num(x) for x in inputs) else None

    p50 = added(run, opod, rate, 50) if opod else math.nan
    p99 = added(run, opod, rate, 99) if opod else math.nan
    overloaded = bool(opod and rate in opod.overloaded)
    goals.append(Goal("added p50", "≤ 1 ms", False if overloaded else verdict(p50 <= 0.001, p50)))
    goals.append(Goal("added p99", "≤ 5 ms", False if overloaded else verdict(p99 <= 0.005, p99)))

    slowest = max((d.p99 for d in run.decisions if d.judged), default=math.nan)
    goals.append(
        Goal(
            "routing decision",
            f"p99 ≤ {GOAL_P99 * 1e6:.0f} µs with {WORKERS} workers, each judged scenario",
            verdict(slowest <= GOAL_P99, slowest),
        )
    )

    sat = opod.saturation if opod else math.nan
    lite = _ran(run, "litellm")
    lite_sat = lite.saturation if lite else math.nan
    rust = [
        p.saturation
        for key in ("vllm-router", "vllm-router-cache", "sglang-router")
        if (p := _ran(run, key)) and _num(p.saturation)
    ]
    rust_best = max(rust) if rust else math.nan
    target = f"≥ 4× LiteLLM ({4 * lite_sat:.0f})" if _num(lite_sat) else "≥ 4× LiteLLM (did not run)"
    target += (
        f", ≥ 0.5× Rust routers ({0.5 * rust_best:.0f})" if _num(rust_best) else ", ≥ 0.5× Rust routers (none ran)"
    )
    met = [verdict(sat >= 4 * lite_sat, sat, lite_sat), verdict(sat >= 0.5 * rust_best, sat, rust_best)]
    goals.append(Goal("saturation", target, None if None in met else all(met)))

    o, r = (opod.prefix if opod else None), (rr.prefix if rr else None)
    sg = _ran(run, "sglang-router")
    vr = _ran(run, "vllm-router")
    sg_p90 = sg.prefix.ttft_p90 if sg and sg.prefix else math.nan
    vr_p90 = vr.prefix.ttft_p90 if vr and vr.prefix else math.nan
    o_p90 = o.ttft_p90 if o else math.nan
    r_p90 = r.ttft_p90 if r else math.nan
    parts = [
        f"≤ RR/20 ({r_p90 / 20:.3f} s)" if _num(r_p90) else "≤ RR/20 (RR did not run)",
        f"≤ sglang/1.5 ({sg_p90 / 1.5:.3f} s)" if _num(sg_p90) else "≤ sglang/1.5 (did not run)",
        f"≤ {_vllm_router_name(vr)} ({vr_p90:.3f} s)" if _num(vr_p90) else "≤ vllm-router kv_aware (did not run)",
    ]
    met = [
        verdict(o_p90 * 20 <= r_p90, o_p90, r_p90),
        verdict(o_p90 * 1.5 <= sg_p90, o_p90, sg_p90),
        verdict(o_p90 <= vr_p90, o_p90, vr_p90),
    ]
    goals.append(Goal("prefix TTFT p90", ", ".join(parts), None if None in met else all(met)))

    o_tps, r_tps = (o.output_tps if o else math.nan), (r.output_tps if r else math.nan)
    goals.append(
        Goal(
            "prefix output tok/s",
            f"≥ 2× RR ({2 * r_tps:.0f})" if _num(r_tps) else "≥ 2× RR (RR did not run)",
            verdict(o_tps >= 2 * r_tps, o_tps, r_tps),
        )
    )
    hit = opod.prefix_hit_rate if opod else math.nan
    best = run.oracle.hit_rate
    goals.append(Goal("prefix cache hits", f"≥ 90% of the oracle ({0.9 * best:.1%})", verdict(hit >= 0.9 * best, hit)))
    o_err, r_err = (o.error_rate if o else math.nan), (r.error_rate if r else math.nan)
    goals.append(
        Goal(
            "prefix error rate",
            f"≤ RR's ({r_err:.1%})" if _num(r_err) else "≤ RR's (RR did not run)",
            verdict(o_err <= r_err, o_err, r_err),
        )
    )
    return goals
