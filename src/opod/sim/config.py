"""Every option of the simulator in one dataclass, and the checks that name the bad one.

Each field carries the CLI option that sets it, so an error raised while
validating a config built in Python reads the same as one from ``opod sim``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DIALECTS", "MODES", "STALL_POINTS", "SimConfig", "SimConfigError"]

DIALECTS = ("vllm", "sglang", "llamacpp", "ollama")
STALL_POINTS = ("first", "mid")
MODES = ("random", "echo")


class SimConfigError(ValueError):
    """A bad option; the message names it (as its CLI flag) and says what is accepted."""


def _opt(default: Any, flag: str, **kw: Any) -> Any:
    return field(default=default, metadata={"flag": flag, **kw})


@dataclass(slots=True)
class SimConfig:
    """The simulator's options. Times are milliseconds unless the name says otherwise."""

    host: str = _opt("127.0.0.1", "--host")
    port: int = _opt(8000, "--port", lo=0, hi=65535)
    models: tuple[str, ...] = _opt(("sim-model",), "--model")
    seed: int = _opt(0, "--seed")
    dialect: str = _opt("vllm", "--dialect", choices=DIALECTS)
    mode: str = _opt("random", "--mode", choices=MODES)
    """``random``: seeded words; ``echo``: the last user message (or prompt) repeated back."""

    # Capacity and the prefix cache.
    block_size: int = _opt(16, "--block-size", lo=1)
    kv_blocks: int = _opt(4096, "--kv-blocks", lo=1)
    max_batch: int = _opt(64, "--max-batch", lo=1)
    max_model_len: int = _opt(8192, "--max-model-len", lo=2)
    output_min: int = _opt(16, "--output-min", lo=1)
    """Shortest natural answer (tokens) when ``max_tokens`` does not cut it first."""
    output_max: int = _opt(128, "--output-max", lo=1)
    """Longest natural answer; the length is drawn per request between min and max."""

    # Latency model.
    ttft_ms: float = _opt(20.0, "--ttft-ms", lo=0)
    prefill_ms_per_token: float = _opt(0.05, "--prefill-ms-per-token", lo=0)
    itl_ms: float = _opt(8.0, "--itl-ms", lo=0)
    itl_ms_per_request: float = _opt(0.1, "--itl-ms-per-request", lo=0)
    time_scale: float = _opt(1.0, "--time-scale", lo=0)
    """Multiplies every latency above: 0.01 runs a hundred times faster, 0 removes them."""

    # LoRA adapters attached at run time (vLLM's /v1/load_lora_adapter).
    enable_lora: bool = _opt(False, "--enable-lora")
    max_lora_rank: int = _opt(16, "--max-lora-rank", lo=1)
    max_loras: int = _opt(1, "--max-loras", lo=1)

    # KV-cache events (vLLM's ZMQ publisher).
    kv_events: str = _opt("", "--kv-events")
    kv_events_bind: str = _opt("", "--kv-events-bind")
    """A second endpoint the PUB socket binds (always, wildcard or not), for an outside subscriber such as vllm-router."""
    kv_events_replay: str = _opt("", "--kv-events-replay")
    kv_events_topic: str = _opt("", "--kv-events-topic")
    kv_events_buffer: int = _opt(10000, "--kv-events-buffer", lo=1)

    # Failure injection (the control endpoint POST /sim/faults changes these at run time).
    fail_rate: float = _opt(0.0, "--fail-rate", lo=0, hi=1)
    fail_status: int = _opt(500, "--fail-status", lo=400, hi=599)
    stall_rate: float = _opt(0.0, "--stall-rate", lo=0, hi=1)
    stall_ms: float = _opt(1000.0, "--stall-ms", lo=0)
    stall_at: str = _opt("first", "--stall-at", choices=STALL_POINTS)
    crash_after: int | None = _opt(None, "--crash-after", lo=0)
    """The process exits when request number ``crash_after + 1`` arrives."""
    crash_after_tokens: int | None = _opt(None, "--crash-after-tokens", lo=0)
    """The process exits mid-stream once a streamed answer has sent this many tokens."""
    load_ms: float = _opt(0.0, "--load-ms", lo=0)

    embedding_dim: int = _opt(384, "--embedding-dim", lo=1, hi=65536)

    def validate(self) -> SimConfig:
        """Check every option; raise :class:`SimConfigError` naming the first bad one."""
        for f in dataclasses.fields(self):
            meta = f.metadata
            value = getattr(self, f.name)
            flag = meta["flag"]
            if "choices" in meta and value not in meta["choices"]:
                raise SimConfigError(f"{flag} must be one of {', '.join(meta['choices'])} (got {value!r})")
            if value is None or isinstance(value, (str, tuple)) or (f.type == "bool" and isinstance(value, bool)):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SimConfigError(f"{flag} must be a number (got {value!r})")
            if "int" in str(f.type) and not isinstance(value, int):
                raise SimConfigError(f"{flag} must be a whole number (got {value!r})")
            lo, hi = meta.get("lo"), meta.get("hi")
            if lo is not None and value < lo:
                raise SimConfigError(f"{flag} must be at least {lo} (got {value})")
            if hi is not None and value > hi:
                raise SimConfigError(f"{flag} must be at most {hi} (got {value})")
        if not self.models or any(not m or not m.strip() for m in self.models):
            raise SimConfigError("--model must name at least one model, and no name may be empty")
        if len(set(self.models)) != len(self.models):
            raise SimConfigError(f"--model was given the same name twice ({', '.join(self.models)})")
        if self.output_min > self.output_max:
            raise SimConfigError(f"--output-min ({self.output_min}) must not exceed --output-max ({self.output_max})")
        for flag, url in (
            ("--kv-events", self.kv_events),
            ("--kv-events-bind", self.kv_events_bind),
            ("--kv-events-replay", self.kv_events_replay),
        ):
            if url and "://" not in url:
                raise SimConfigError(f"{flag} must be a ZMQ endpoint such as tcp://127.0.0.1:5557 (got {url!r})")
        if self.enable_lora and self.dialect != "vllm":
            raise SimConfigError(f"--enable-lora is vLLM's runtime LoRA API; the {self.dialect} dialect has none")
        if self.kv_events_bind and self.kv_events_bind == self.kv_events:
            raise SimConfigError(
                f"--kv-events-bind must differ from --kv-events (both are {self.kv_events!r}); "
                "it is a second endpoint for another subscriber"
            )
        if self.kv_events_replay and not (self.kv_events or self.kv_events_bind):
            raise SimConfigError(
                "--kv-events-replay needs --kv-events or --kv-events-bind (replay serves what the publisher sent)"
            )
        return self

    @property
    def model(self) -> str:
        """The first model name: the one metrics are labelled with, as vLLM does with several served names."""
        return self.models[0]

    @property
    def scaled(self) -> bool:
        """True when any latency is in effect; False makes the hot path skip every sleep."""
        return (
            self.time_scale > 0
            and (self.ttft_ms or self.prefill_ms_per_token or self.itl_ms or self.itl_ms_per_request) > 0
        )
