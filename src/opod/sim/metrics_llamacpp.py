"""``/metrics`` in llama-server's form: unlabelled ``llamacpp:*`` families, written by hand.

llama-server does not use prometheus_client: some counters have no ``_total``
suffix and no ``_created`` lines, and its two throughput gauges cover only the
time since the previous scrape (a scrape resets them). The simulator keeps
those quirks so that a driver's parser meets the real thing.
"""

from __future__ import annotations

from opod.sim.engine import Engine

__all__ = ["LlamaCppMetrics"]

_FAMILIES = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "counter",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


class LlamaCppMetrics:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        s = engine.stats
        self._last = (s.prompt_tokens - s.cached_tokens, s.prompt_seconds, s.generation_tokens, s.decode_seconds)

    def render(self) -> bytes:
        e = self.engine
        s = e.stats
        computed = s.prompt_tokens - s.cached_tokens
        p0, ps0, g0, gs0 = self._last
        self._last = (computed, s.prompt_seconds, s.generation_tokens, s.decode_seconds)
        prompt_rate = (computed - p0) / (s.prompt_seconds - ps0) if s.prompt_seconds > ps0 else 0.0
        predicted_rate = (s.generation_tokens - g0) / (s.decode_seconds - gs0) if s.decode_seconds > gs0 else 0.0
        values = {
            "prompt_tokens_total": computed,
            "prompt_tokens_cached_total": s.cached_tokens,
            "prompt_seconds_total": round(s.prompt_seconds, 6),
            "tokens_predicted_total": s.generation_tokens,
            "tokens_predicted_seconds_total": round(s.decode_seconds, 6),
            "n_decode_total": s.decode_steps,
            "n_tokens_max": s.max_sequence,
            "spec_decode_num_draft_tokens_total": 0,
            "spec_decode_num_accepted_tokens_total": 0,
            "spec_decode_num_drafts_total": 0,
            "prompt_tokens_seconds": round(prompt_rate, 3),
            "predicted_tokens_seconds": round(predicted_rate, 3),
            "requests_processing": e.running,
            "requests_deferred": e.waiting,
            "n_busy_slots_per_decode": round(s.busy_at_decode / s.decode_steps, 3) if s.decode_steps else 0,
        }
        lines: list[str] = []
        for name, kind, doc in _FAMILIES:
            full = f"llamacpp:{name}"
            lines += [f"# HELP {full} {doc}", f"# TYPE {full} {kind}", f"{full} {_num(values[name])}"]
        return ("\n".join(lines) + "\n").encode()
