"""What every engine driver provides: how to start the engine, tell when it is ready, and read its load.

A driver knows one engine's command line, its readiness endpoint, its
Prometheus metric names and its optional abilities (sleep, unload, tokenize).
It holds no process and no state of its own: the worker's supervisor runs the
argv, and the worker's agent asks the driver to interpret what the engine says.
Drivers are registered in :mod:`opod.engines.registry` and all pass one
conformance suite (``tests/engines/test_conformance.py``).

Refinements made while writing the drivers (all additive, defaults keep the
first version's behaviour):

- ``LaunchSpec.launcher``: the command prefix the worker chose, because the
  llama.cpp route is not always one executable (the portable route is
  ``python -m opod.engines.xllama``) and a SIGILL fallback must be able to
  relaunch on another route; ``LaunchSpec.sleep_mode``: vLLM's sleep tier
  needs flags and environment at launch (``OPOD_SLEEP_MODE``).
- ``MetricsState.slots``: the slot count is not in every engine's metrics
  (llama.cpp has it in ``/props``, SGLang in ``/server_info``), so the first
  scrape asks once and the state carries it to later samples.
- ``EngineDriver.dialect``, ``launchable``, ``loading_status``,
  ``flag_keys``, ``default_port``: facts the conformance suite and the
  worker read instead of special-casing engine ids.
- ``slots()``, ``load()``, ``unload()``, ``canonical_model_name()`` and
  ``unused_flags()``: the slot count, an operator-run daemon's model residency
  (Ollama, which lists ``llama3.2`` as ``llama3.2:latest``), and a way to warn
  about plan flags a driver ignores.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    """Tokens one request may use, prompt and answer (vLLM's ``--max-model-len``); 0 = the engine's default.
    A driver whose engine shares one context across its slots (llama-server) sizes it for all of them."""
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
    launcher: tuple[str, ...] = ()
    """Command prefix that starts the engine (e.g. a llama.cpp route after a SIGILL fallback); empty = the driver's choice."""
    tool_call_parser: str = ""
    """The engine's parser for the model's tool calls (the catalog's ``tool_call_parser``); empty = none:
    the engine is started without tool calling."""
    sleep_mode: bool = False
    """Start the engine able to sleep (vLLM ``--enable-sleep-mode``), for the sleep tier."""


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


def combined(samples: Sequence[LoadSample], at: float) -> LoadSample:
    """Several engines' load as one machine's: the fullest KV cache, queues, running requests, rates and slots
    summed, the mean prefix-cache hit rate."""
    kv = [s.kv_used_pct for s in samples if s.kv_used_pct is not None]
    hits = [s.prefix_hit_pct for s in samples if s.prefix_hit_pct is not None]
    slots = sum(s.slots or 0 for s in samples)
    return LoadSample(
        sampled_at=at,
        kv_used_pct=max(kv) if kv else None,
        queue_depth=sum(s.queue_depth or 0 for s in samples),
        running=sum(s.running or 0 for s in samples),
        tokens_per_s=sum(s.tokens_per_s or 0.0 for s in samples),
        prefix_hit_pct=sum(hits) / len(hits) if hits else None,
        slots=slots or None,
    )


@dataclass(frozen=True, slots=True)
class MetricsState:
    """Counter values kept between two scrapes, so rates can be computed from deltas."""

    at: float
    counters: Mapping[str, float] = field(default_factory=dict)
    slots: int | None = None
    """Slot count learned once from the engine (``/props``, ``/server_info``), carried to later samples."""


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
    dialect: ClassVar[str] = ""
    """Whose wire this driver reads (``vllm``, ``sglang``, ``llamacpp``, ``ollama``); ``opod sim`` speaks each."""
    launchable: ClassVar[bool] = True
    """False for a daemon its operator runs (Ollama): :meth:`argv` raises :class:`~opod.engines.errors.NotLaunchable`."""
    loading_status: ClassVar[int | None] = 503
    """The status the health path answers while weights load; ``None`` when the engine has no such phase."""
    flag_keys: ClassVar[frozenset[str]] = frozenset()
    """The plan flags this driver reads; others are reported by :meth:`unused_flags`."""
    default_port: ClassVar[int] = 0
    """The port the engine listens on when nobody says (a daemon's well-known port)."""
    publishes_kv_events: ClassVar[bool] = False
    """True when the engine publishes vLLM-format KV-cache events on ``LaunchSpec.kv_events_endpoint``;
    the worker then listens and reports block hashes in its heartbeats."""
    computes_on_cpu: ClassVar[bool] = False
    """True when the engine's work is done on the CPU (llama.cpp): it gets every CPU, not only those leaders' event
    loops leave (``opod.http.cpu.engine_cpus``)."""
    lora_ranks: ClassVar[tuple[int, ...]] = ()
    """The ranks the engine can be started for to attach LoRA adapters at run time; empty = it cannot."""

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
                if self.loading_status is not None and resp.status == self.loading_status:
                    return Readiness.LOADING
                return Readiness.DOWN
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Readiness.DOWN

    @abstractmethod
    def parse_metrics(
        self, text: str, previous: MetricsState | None, now: float | None = None
    ) -> tuple[LoadSample, MetricsState]:
        """Turn the engine's Prometheus text into a load sample; ``previous`` gives rates."""

    async def sample(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        previous: MetricsState | None,
        spec: LaunchSpec | None = None,
    ) -> tuple[LoadSample, MetricsState] | None:
        """Scrape and parse; ``None`` when the engine did not answer, or answered something that is not metrics.

        The slot count is asked once (:meth:`slots`) and then carried in the state.
        """
        if self.metrics_path is None:
            return None
        try:
            async with session.get(base_url + self.metrics_path, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        if previous is None or previous.slots is None:
            slots = await self.slots(session, base_url, spec)
            if slots is not None:
                previous = replace(previous, slots=slots) if previous else MetricsState(at=time.time(), slots=slots)
        try:
            return self.parse_metrics(text, previous, time.time())
        except ValueError:
            return None

    async def slots(self, session: aiohttp.ClientSession, base_url: str, spec: LaunchSpec | None = None) -> int | None:
        """Requests the engine serves at once; ``None`` = unknown. The default is what the spec asked for."""
        if spec is not None and spec.parallel > 0:
            return spec.parallel
        return None

    def unused_flags(self, spec: LaunchSpec) -> list[str]:
        """Plan flags this driver does not read, sorted, so the worker can say they were ignored."""
        return sorted(k for k in spec.flags if k not in self.flag_keys)

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

    def canonical_model_name(self, name: str) -> str:
        """The spelling the engine lists ``name`` under, to compare a requested model with :meth:`served_models`."""
        return name

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

    async def load(self, session: aiohttp.ClientSession, base_url: str, model: str, *, pin: bool = False) -> None:
        """Make a model resident in an engine that holds many (only when ``serves_many_models``)."""
        raise NotImplementedError(f"{self.id} serves the one model it was started with; start another engine instead")

    async def unload(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        """Drop a model without stopping the engine (only when ``can_unload``)."""
        raise NotImplementedError(f"{self.id} cannot drop its model; stop the engine process instead")

    # --- LoRA adapters, attached at run time and served as ``<base>:<name>`` ----------------------

    def lora_rank(self, spec: LaunchSpec) -> int:
        """The largest adapter rank the engine launched from ``spec`` takes; 0 = it takes none at run time."""
        return 0

    async def attach_adapter(self, session: aiohttp.ClientSession, base_url: str, adapter_id: str, source: str) -> None:
        """Serve the adapter at ``source`` under the model name ``adapter_id`` (only when :meth:`lora_rank` > 0)."""
        raise NotImplementedError(f"{self.id} cannot attach LoRA adapters at run time")

    async def detach_adapter(self, session: aiohttp.ClientSession, base_url: str, adapter_id: str) -> None:
        raise NotImplementedError(f"{self.id} cannot detach LoRA adapters at run time")
