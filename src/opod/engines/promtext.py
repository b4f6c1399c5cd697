"""Reading an engine's Prometheus text, and rates between two scrapes.

Engines label their series differently (vLLM: ``engine``, ``model_name``;
SGLang: ``tp_rank``, ``dp_rank``…; llama.cpp: none) and print labels in any
order, so lookups here go by sample name and label *values*, never by
position. A sample whose value is NaN counts as missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from opod.engines.base import MetricsState
from opod.engines.errors import MetricsParseError

Labels = Mapping[str, str]
Where = Callable[[Labels], bool]


ENGINE_PREFIXES = ("vllm:", "sglang:", "llamacpp:")
"""The engines' own series; the rest of a page (process, GC, HTTP histograms) is never read."""


def engine_series(text: str) -> str:
    """Only the engine's own gauges and counters: a full vLLM page takes ~13 ms to parse, this part ~1 ms.

    Parsing runs on the worker's event loop between requests, so it must stay short.
    Histogram and summary families are dropped whole (no driver reads them).
    """
    if not any(p in text for p in ENGINE_PREFIXES):
        return text  # not an engine page we know: let the parser judge it
    dropped: set[str] = set()
    kept: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or not parts[2].startswith(ENGINE_PREFIXES):
                continue
            if parts[1] == "TYPE" and len(parts) > 3 and parts[3].strip() in ("histogram", "summary"):
                dropped.add(parts[2])
                continue
            if parts[2] in dropped:
                continue
            kept.append(line)
            continue
        if not line.startswith(ENGINE_PREFIXES):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in dropped or name.rsplit("_", 1)[0] in dropped or name.endswith("_bucket"):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


class Scrape:
    """One /metrics page, indexed by sample name (``x_total``, ``x_created``…)."""

    def __init__(self, text: str, engine: str) -> None:
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        try:
            for family in text_string_to_metric_families(engine_series(text)):
                for s in family.samples:
                    if s.value is None or math.isnan(s.value):
                        continue
                    self._by_name.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        except (ValueError, TypeError, IndexError) as err:
            raise MetricsParseError(
                f"{engine}: /metrics is not Prometheus text ({err}); is the port an engine's?"
            ) from err

    def has(self, name: str) -> bool:
        return name in self._by_name

    def values(self, name: str, where: Where | None = None) -> list[float]:
        return [v for labels, v in self._by_name.get(name, ()) if where is None or where(labels)]

    def total(self, name: str, where: Where | None = None) -> float | None:
        """Sum over matching series (several DP engines, several label sets); ``None`` = absent."""
        vals = self.values(name, where)
        return math.fsum(vals) if vals else None

    def mean(self, name: str, where: Where | None = None) -> float | None:
        vals = self.values(name, where)
        return math.fsum(vals) / len(vals) if vals else None

    def first_total(self, names: tuple[str, ...], where: Where | None = None) -> float | None:
        """The total of the first name present: engines renamed series across releases."""
        for name in names:
            value = self.total(name, where)
            if value is not None:
                return value
        return None

    def first_mean(self, names: tuple[str, ...], where: Where | None = None) -> float | None:
        for name in names:
            value = self.mean(name, where)
            if value is not None:
                return value
        return None


def as_count(value: float | None) -> int | None:
    return None if value is None else max(0, int(round(value)))


def fraction_to_pct(value: float | None) -> float | None:
    """A 0..1 fraction as 0–100, clamped (an engine can overshoot by rounding)."""
    return None if value is None else min(100.0, max(0.0, value * 100.0))


def loose_pct(value: float | None) -> float | None:
    """A ratio some releases print as 0..1 and others as 0..100."""
    if value is None:
        return None
    return fraction_to_pct(value) if value <= 1.0 else min(100.0, value)


def counter_rate(name: str, counters: Mapping[str, float], previous: MetricsState | None, now: float) -> float | None:
    """Per-second growth of a counter since the previous scrape.

    ``None`` on the first scrape (no interval yet) and when the counter went
    backwards (the engine restarted, so the delta means nothing).
    """
    if previous is None or name not in counters or name not in previous.counters:
        return None
    dt = now - previous.at
    delta = counters[name] - previous.counters[name]
    if dt <= 0 or delta < 0:
        return None
    return delta / dt


def counter_share(part: str, whole: str, counters: Mapping[str, float], previous: MetricsState | None) -> float | None:
    """``100 × Δpart / Δwhole`` since the previous scrape (hits over queries).

    Counters start at zero with the engine, so without a previous scrape (or
    after a restart) the totals themselves are the delta since the start.
    ``None`` when nothing was asked in the interval.
    """
    if part not in counters or whole not in counters:
        return None
    d_part, d_whole = counters[part], counters[whole]
    if previous is not None and part in previous.counters and whole in previous.counters:
        p, w = d_part - previous.counters[part], d_whole - previous.counters[whole]
        if p >= 0 and w >= 0:
            d_part, d_whole = p, w
    if d_whole <= 0:
        return None
    return min(100.0, max(0.0, 100.0 * d_part / d_whole))
