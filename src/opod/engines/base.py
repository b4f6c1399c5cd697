"""What every engine driver provides: how to start the engine, tell when it is ready, and read its load.

A driver knows one engine's command line, its readiness endpoint, its
Prometheus metric names and its optional abilities (sleep, unload, tokenize).
It holds no process and no state of its own: the worker's supervisor runs the
argv, and the worker's agent asks the driver to interpret what the engine says.
Drivers are registered in :mod:`opod.engines.registry` and all pass one
conformance suite (``tests/engines/test_conformance.py``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

import aiohttp

from opod.contract import nodeapi


class Readiness(StrEnum):
    """What one readiness probe found."""

    READY = "ready"
    LOADING = "loading"
    """Listening, but weights are not in yet (llama-server answers 503 "Loading model")."""
    DOWN = "down"
    """Not answering at all."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything a driver needs to build an engine's command line."""

    model_id: str
    """The name the model is served under (the catalog id)."""
    model: str
    """What the engine loads: a local file or directory, or an engine-native name (Ollama)."""
    host: str = "127.0.0.1"
    port: int = 0
    context: int = 0
    """Context length in tokens; 0 = the engine's default."""
    parallel: int = 0
    """Requests served at once (slots / max sequences); 0 = the engine's default."""
    threads: int = 0
    """CPU threads; 0 = the engine's default."""
    embeddings: bool = False
    rerank: bool = False
    binary: str = ""
    """Path of the engine executable when the driver cannot find it itself."""
    flags: Mapping[str, object] = field(default_factory=dict)
    """Engine flags from the plan (``OPOD_ENGINE_FLAGS``): ``ctx``, ``ngl``, ``tp``, ``max_model_len``, ``extra``…"""
    kv_events_endpoint: str = ""
    """Where an engine that publishes KV-cache events should publish them (e.g. ``tcp://127.0.0.1:5557``)."""


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One reading of an engine's load, from its own metrics. ``None`` = the engine did not say."""

    sampled_at: float
    kv_used_pct: float | None = None
    """KV cache in use, 0–100."""
    queue_depth: int | None = None
    """Requests waiting for a slot."""
    running: int | None = None
    """Requests being generated now."""
    tokens_per_s: float | None = None
    """Generation rate since the previous sample."""
    prefix_hit_pct: float | None = None
    """Prefix-cache hit rate, 0–100, since the previous sample."""
    slots: int | None = None
    """Requests the engine can serve at once."""

    def to_engine_load(self) -> nodeapi.EngineLoad:
        """The heartbeat's ``load`` object (the wire has no "unknown", so unknown reads 0)."""
        return nodeapi.EngineLoad(
            kv_used_pct=self.kv_used_pct or 0.0,
            queue_depth=self.queue_depth or 0,
            tokens_per_s=self.tokens_per_s or 0.0,
            prefix_hit_pct=self.prefix_hit_pct or 0.0,
            sampled_at=int(self.sampled_at),
        )


@dataclass(frozen=True, slots=True)
class MetricsState:
    """Counter values kept between two scrapes, so rates can be computed from deltas."""

    at: float
    counters: Mapping[str, float] = field(default_factory=dict)


class EngineDriver(ABC):
    """One engine. Subclasses are stateless; one instance serves every engine process of its kind."""

    id: ClassVar[str]
    """Canonical id (``llamacpp``, ``vllm``, ``sglang``, ``ollama``, ``sim``)."""
    aliases: ClassVar[tuple[str, ...]] = ()
    native: ClassVar[str] = "path"
    """The catalog source field the engine loads by: ``path``, ``repo``, ``ollama_name`` or ``id``."""
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str | None] = "/metrics"
    can_sleep: ClassVar[bool] = False
    can_unload: ClassVar[bool] = False
    """True when the engine itself can drop a model without its process being stopped."""
    can_tokenize: ClassVar[bool] = False
    serves_many_models: ClassVar[bool] = False
    """True when one engine process holds several models (Ollama)."""

    @abstractmethod
    def argv(self, spec: LaunchSpec) -> list[str]:
        """The command line that starts the engine for ``spec``; never a shell string."""

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment for the engine process."""
        return {}

    async def readiness(self, session: aiohttp.ClientSession, base_url: str) -> Readiness:
        """Probe the engine once."""
        try:
            async with session.get(base_url + self.health_path, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return Readiness.READY
                return Readiness.LOADING if resp.status == 503 else Readiness.DOWN
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Readiness.DOWN

    @abstractmethod
    def parse_metrics(self, text: str, previous: MetricsState | None, now: float | None = None) -> tuple[LoadSample, MetricsState]:
        """Turn the engine's Prometheus text into a load sample; ``previous`` gives rates."""

    async def sample(
        self, session: aiohttp.ClientSession, base_url: str, previous: MetricsState | None
    ) -> tuple[LoadSample, MetricsState] | None:
        """Scrape and parse; ``None`` when the engine did not answer."""
        if self.metrics_path is None:
            return None
        try:
            async with session.get(base_url + self.metrics_path, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        return self.parse_metrics(text, previous, time.time())

    async def served_models(self, session: aiohttp.ClientSession, base_url: str) -> list[str] | None:
        """The model names the engine answers for (``GET /v1/models``); ``None`` = no answer."""
        try:
            async with session.get(base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=3)) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return None
        return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]

    async def tokenize(
        self, session: aiohttp.ClientSession, base_url: str, request: nodeapi.TokenizeRequest
    ) -> list[int] | None:
        """Token ids for a prompt with the chat template applied; ``None`` = the engine cannot."""
        return None

    async def sleep(self, session: aiohttp.ClientSession, base_url: str) -> None:
        """Drop the working set (only when ``can_sleep``)."""
        raise NotImplementedError(f"{self.id} has no sleep mode")

    async def resume(self, session: aiohttp.ClientSession, base_url: str) -> None:
        raise NotImplementedError(f"{self.id} has no sleep mode")
