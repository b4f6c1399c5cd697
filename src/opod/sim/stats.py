"""The numbers the metrics endpoints report, kept as plain counters so the request path stays cheap.

Each dialect's renderer turns these into its engine's names at scrape time.
Histogram buckets differ between engines, so the dialect chooses them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence

__all__ = ["FINISH_REASONS", "Histogram", "Stats", "vllm_buckets", "sglang_buckets"]

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

_E2E = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


def _one_two_five(cap: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, … up to ``cap``."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            v = m * scale
            if v > cap:
                return tuple(float(x) for x in out)
            out.append(v)
        scale *= 10


def vllm_buckets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    tokens = _one_two_five(max_model_len)
    return {
        "ttft": (
            0.001,
            0.005,
            0.01,
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.25,
            0.5,
            0.75,
            1.0,
            2.5,
            5.0,
            7.5,
            10.0,
            20.0,
            40.0,
            80.0,
            160.0,
            640.0,
            2560.0,
        ),
        "itl": _ITL,
        "tpot": _ITL,
        "e2e": _E2E,
        "queue": _E2E,
        "prefill": _E2E,
        "decode": _E2E,
        "inference": _E2E,
        "prompt_len": tokens,
        "gen_len": tokens,
        "max_tokens": tokens,
        "prefill_computed": tokens,
        "params_n": (1.0, 2.0, 5.0, 10.0, 20.0),
    }


def sglang_buckets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    out = vllm_buckets(max_model_len)
    out["ttft"] = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
    out["itl"] = (
        0.002,
        0.004,
        0.006,
        0.008,
        0.010,
        0.015,
        0.020,
        0.025,
        0.030,
        0.035,
        0.040,
        0.060,
        0.080,
        0.100,
        0.200,
        0.400,
        0.600,
        0.800,
        1.0,
        2.0,
        4.0,
        6.0,
        8.0,
    )
    out["e2e"] = (
        0.1,
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        2.0,
        4.0,
        6.0,
        8.0,
        10.0,
        20.0,
        40.0,
        60.0,
        80.0,
        100.0,
        200.0,
        400.0,
        600.0,
        1200.0,
        1800.0,
        2400.0,
    )
    return out


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, count ≤ bound)`` pairs, ending with ``(inf, total)``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append((bound, running))
        return out


class Stats:
    """Counters since start; gauges are read from the engine at scrape time."""

    def __init__(self, buckets: Mapping[str, Sequence[float]]) -> None:
        self.created = time.time()
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        """Prompt tokens served from the prefix cache (vLLM's prefix_cache_hits_total)."""
        self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_seconds = 0.0
        self.decode_seconds = 0.0
        self.decode_steps = 0
        self.busy_at_decode = 0
        self.max_sequence = 0
        self.last_hit_rate = 0.0
        self.embedding_requests = 0
        h = {name: Histogram(bounds) for name, bounds in buckets.items()}
        self.ttft = h["ttft"]
        self.itl = h["itl"]
        self.tpot = h["tpot"]
        self.e2e = h["e2e"]
        self.queue = h["queue"]
        self.prefill = h["prefill"]
        self.decode = h["decode"]
        self.inference = h["inference"]
        self.prompt_len = h["prompt_len"]
        self.gen_len = h["gen_len"]
        self.max_tokens = h["max_tokens"]
        self.prefill_computed = h["prefill_computed"]
        self.params_n = h["params_n"]
