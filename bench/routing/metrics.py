"""What the report shows, computed from a phase's samples.

Percentiles are nearest-rank on the sorted values (no interpolation), so a
reported p99 is a latency some request really had. Rates divide by the phase's
own time: the measured window of a closed loop, or first due time to last
completion of an open loop, so a path that finishes late pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.load import Phase

NAN = float("nan")


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100); NaN for no values."""
    if not values:
        return NAN
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class LatencySummary:
    """Non-streamed requests: completions per second and end-to-end latency."""

    rps: float
    p50: float
    p90: float
    p99: float
    ok: int
    errors: int
    first_error: str = ""
    own_p50: float = NAN
    own_p99: float = NAN
    """The router's own time per request, as its ``Server-Timing`` header says (opod); NaN when it says nothing."""

    @property
    def error_rate(self) -> float:
        total = self.ok + self.errors
        return self.errors / total if total else 0.0


def _first_error(phase: Phase) -> str:
    return next((s.error for s in phase.samples if not s.ok and s.error), "")


def latency_summary(phase: Phase) -> LatencySummary:
    good = [s.latency for s in phase.samples if s.ok]
    own = [s.own for s in phase.samples if s.ok and s.own is not None]
    return LatencySummary(
        len(good) / phase.seconds if phase.seconds else 0.0,
        pct(good, 50),
        pct(good, 90),
        pct(good, 99),
        len(good),
        phase.sent - len(good),
        _first_error(phase),
        pct(own, 50),
        pct(own, 99),
    )


@dataclass(frozen=True)
class StreamSummary:
    """Streamed requests: time to first token, inter-token latency, throughput, goodput and errors."""

    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    output_tps: float
    """Output tokens of successful requests per second of the phase."""
    goodput: float
    """Successful requests whose TTFT met the SLO, per second of the phase."""
    ok: int
    errors: int
    sent: int
    first_error: str = ""

    @property
    def error_rate(self) -> float:
        return self.errors / self.sent if self.sent else 0.0


def stream_summary(phase: Phase, ttft_slo: float = math.inf) -> StreamSummary:
    good = [s for s in phase.samples if s.ok]
    ttfts = [s.ttft for s in good if s.ttft is not None]
    gaps = [g for s in good for g in s.gaps]
    tokens = sum(s.tokens for s in good)
    met = sum(1 for t in ttfts if t <= ttft_slo)
    first_error = _first_error(phase)
    seconds = phase.seconds or 1e-9
    return StreamSummary(
        pct(ttfts, 50),
        pct(ttfts, 90),
        pct(ttfts, 99),
        pct(gaps, 50),
        pct(gaps, 99),
        tokens / seconds,
        met / seconds,
        len(good),
        phase.sent - len(good),
        phase.sent,
        first_error,
    )


def saturation(points: dict[int, LatencySummary]) -> float:
    """Requests per second at saturation: the best rate over the concurrency sweep; NaN when nothing succeeded."""
    best = max((p.rps for p in points.values()), default=0.0)
    return best if best > 0 else NAN


def ratio(numerator: float, denominator: float) -> float:
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return NAN
    return numerator / denominator
