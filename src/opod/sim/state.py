"""Everything one simulator instance holds, shared by its routes."""

from __future__ import annotations

import time

from starlette.responses import Response

from opod.sim.config import SimConfig, SimConfigError
from opod.sim.engine import Engine
from opod.sim.errors import SimHTTPError, error_response
from opod.sim.faults import FaultInjector
from opod.sim.kv_events import KVEventPublisher, KVEventsError
from opod.sim.shapes import SHAPES, Shape

__all__ = ["SimState"]

_FLAVORS = {"vllm": "openai", "sglang": "openai", "llamacpp": "llamacpp", "ollama": "openai"}


def _publisher(cfg: SimConfig) -> KVEventPublisher:
    """The KV-event sockets, or a config error naming the option whose endpoint would not open."""
    try:
        return KVEventPublisher(
            cfg.kv_events, cfg.kv_events_topic, cfg.kv_events_replay, cfg.kv_events_buffer, cfg.kv_events_bind
        )
    except KVEventsError as err:
        flag = {cfg.kv_events: "--kv-events", cfg.kv_events_bind: "--kv-events-bind"}.get(
            err.endpoint, "--kv-events-replay"
        )
        raise SimConfigError(f"{flag}: {err}") from None


class SimState:
    def __init__(self, cfg: SimConfig, *, loads_before_listening: bool = False) -> None:
        """``loads_before_listening``: the server spends the load phase before it listens (vLLM's
        way), so the app counts none of it; an app served in-process counts it from its start."""
        self.cfg = cfg
        self.publisher: KVEventPublisher | None = None
        if cfg.kv_events or cfg.kv_events_bind:
            self.publisher = _publisher(cfg)
        pub = self.publisher
        self.adapters: dict[str, str] = {}
        """LoRA adapters attached at run time: name → the path they were loaded from."""
        self.engine = Engine(cfg, pub.publish if pub else None, pub.step if pub else None, adapters=self.adapters)
        self.faults = FaultInjector(cfg)
        self.shape: Shape = SHAPES[cfg.dialect]()
        self.flavor = _FLAVORS[cfg.dialect]
        """The error shape of the OpenAI routes."""
        self.served = cfg.models
        self.listed = cfg.models
        """Names a request may use; Ollama also accepts ``name:latest`` for an untagged name."""
        if cfg.dialect == "ollama":
            self.listed = tuple(m if ":" in m else f"{m}:latest" for m in cfg.models)
            self.served = tuple(dict.fromkeys([*cfg.models, *self.listed]))
        self._served, self._listed = self.served, self.listed
        """The configured names, before any adapter."""
        self.created = int(time.time())
        self.ready_at = time.monotonic() + cfg.load_ms / 1000.0
        self.loads_before_listening = loads_before_listening

    def attach(self, name: str, path: str) -> None:
        """Serve an adapter under ``name`` (over the first model); requests and /v1/models see it at once."""
        self.adapters[name] = path
        self._list()

    def detach(self, name: str) -> None:
        del self.adapters[name]
        self._list()

    def _list(self) -> None:
        self.served, self.listed = (*self._served, *self.adapters), (*self._listed, *self.adapters)

    def loading(self) -> bool:
        """In the start-up load phase (Ollama has none: its models load on first use)."""
        return self.cfg.dialect != "ollama" and time.monotonic() < self.ready_at

    def start_loading_now(self) -> None:
        """The load phase counts from when the app starts serving."""
        self.ready_at = time.monotonic() + (0.0 if self.loads_before_listening else self.cfg.load_ms / 1000.0)

    def error(self, err: SimHTTPError) -> Response:
        return error_response(self.flavor, err)

    def injected(self) -> SimHTTPError:
        status = self.faults.faults.fail_status
        return SimHTTPError(status, f"injected failure (opod sim fault injection, status {status})")

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
