"""The latency model: how long prefill and each decode step take.

TTFT = base + per-token prefill cost × the prompt tokens the prefix cache did
not cover (queueing for a batch slot comes on top, for real). Each decode step
takes a base time plus a cost per request in the running batch, so a fuller
batch generates every stream more slowly. ``time_scale`` multiplies all of it.
"""

from __future__ import annotations

from opod.sim.config import SimConfig

__all__ = ["LatencyModel"]


class LatencyModel:
    __slots__ = ("active", "_ttft", "_prefill", "_itl", "_per_request")

    def __init__(self, cfg: SimConfig) -> None:
        scale = cfg.time_scale / 1000.0
        self._ttft = cfg.ttft_ms * scale
        self._prefill = cfg.prefill_ms_per_token * scale
        self._itl = cfg.itl_ms * scale
        self._per_request = cfg.itl_ms_per_request * scale
        self.active = bool(cfg.scaled)
        """False when every delay is zero: callers then skip sleeping altogether."""

    def prefill(self, uncached_tokens: int) -> float:
        """Seconds from admission to the first token."""
        return self._ttft + self._prefill * uncached_tokens

    def decode_step(self, running: int) -> float:
        """Seconds for one decode step while ``running`` requests share the batch."""
        return self._itl + self._per_request * running
