"""``opod sim``: run the engine simulator in the foreground."""

from __future__ import annotations

import sys

import typer

from opod.sim.config import SimConfig, SimConfigError

__all__ = ["command"]

_D = SimConfig()


def command(
    host: str = typer.Option(_D.host, "--host", metavar="HOST", help="Address to listen on."),
    port: int = typer.Option(
        _D.port, "--port", metavar="PORT", help="Port to listen on; 0 picks a free one (the banner says which)."
    ),
    model: list[str] = typer.Option(
        list(_D.models), "--model", metavar="NAME", help="A model name to serve; repeat for several."
    ),
    seed: int = typer.Option(
        _D.seed,
        "--seed",
        help="Seed for answers, lengths and faults: the same seed and requests give the same results.",
    ),
    dialect: str = typer.Option(
        _D.dialect, "--dialect", metavar="DIALECT", help="Engine wire to speak: vllm, sglang, llamacpp or ollama."
    ),
    mode: str = typer.Option(
        _D.mode, "--mode", metavar="MODE", help="random (seeded words) or echo (the last user message back)."
    ),
    block_size: int = typer.Option(_D.block_size, "--block-size", help="Tokens per KV block."),
    kv_blocks: int = typer.Option(_D.kv_blocks, "--kv-blocks", help="KV blocks in the cache (its capacity)."),
    max_batch: int = typer.Option(_D.max_batch, "--max-batch", help="Requests run at once; more wait in the queue."),
    max_model_len: int = typer.Option(
        _D.max_model_len, "--max-model-len", help="Context length in tokens (prompt + answer)."
    ),
    output_min: int = typer.Option(_D.output_min, "--output-min", help="Shortest natural answer, in tokens."),
    output_max: int = typer.Option(_D.output_max, "--output-max", help="Longest natural answer, in tokens."),
    ttft_ms: float = typer.Option(_D.ttft_ms, "--ttft-ms", help="Base time to first token, ms."),
    prefill_ms_per_token: float = typer.Option(
        _D.prefill_ms_per_token, "--prefill-ms-per-token", help="Prefill cost per uncached prompt token, ms."
    ),
    itl_ms: float = typer.Option(_D.itl_ms, "--itl-ms", help="Base inter-token latency, ms."),
    itl_ms_per_request: float = typer.Option(
        _D.itl_ms_per_request, "--itl-ms-per-request", help="Inter-token latency added per running request, ms."
    ),
    time_scale: float = typer.Option(
        _D.time_scale, "--time-scale", help="Multiplies every latency; 0 turns the latency model off."
    ),
    enable_lora: bool = typer.Option(
        _D.enable_lora,
        "--enable-lora",
        help="Serve vLLM's runtime LoRA API (/v1/load_lora_adapter); adapters answer under their lora_name.",
    ),
    max_lora_rank: int = typer.Option(
        _D.max_lora_rank, "--max-lora-rank", help="With --enable-lora: the largest adapter rank accepted."
    ),
    max_loras: int = typer.Option(
        _D.max_loras,
        "--max-loras",
        help="With --enable-lora: accepted for vLLM's argv; the simulator batches adapters freely.",
    ),
    kv_events: str = typer.Option(
        _D.kv_events,
        "--kv-events",
        metavar="ENDPOINT",
        help="Publish vLLM KV-cache events on this ZMQ endpoint (tcp://127.0.0.1:5557 connects, tcp://*:5557 binds).",
    ),
    kv_events_bind: str = typer.Option(
        _D.kv_events_bind,
        "--kv-events-bind",
        metavar="ENDPOINT",
        help="Also bind the KV-event PUB socket here (tcp://*:5560), so an outside subscriber such as vllm-router can connect; same events, same sequence numbers.",
    ),
    kv_events_replay: str = typer.Option(
        _D.kv_events_replay,
        "--kv-events-replay",
        metavar="ENDPOINT",
        help="Serve event replay on this ZMQ ROUTER endpoint (binds).",
    ),
    kv_events_topic: str = typer.Option(
        _D.kv_events_topic, "--kv-events-topic", metavar="TOPIC", help="Topic frame of every event message."
    ),
    fail_rate: float = typer.Option(
        _D.fail_rate, "--fail-rate", help="Fraction of requests answered with an error (0..1)."
    ),
    fail_status: int = typer.Option(
        _D.fail_status, "--fail-status", metavar="STATUS", help="HTTP status of injected errors."
    ),
    stall_rate: float = typer.Option(_D.stall_rate, "--stall-rate", help="Fraction of requests that stall (0..1)."),
    stall_ms: float = typer.Option(_D.stall_ms, "--stall-ms", help="How long a stall lasts, ms."),
    stall_at: str = typer.Option(
        _D.stall_at,
        "--stall-at",
        metavar="WHEN",
        help="first (before the first token) or mid (halfway through the answer).",
    ),
    crash_after: int | None = typer.Option(None, "--crash-after", help="Exit when request N+1 arrives."),
    crash_after_tokens: int | None = typer.Option(
        None, "--crash-after-tokens", help="Exit mid-stream once a stream has sent this many tokens."
    ),
    load_ms: float = typer.Option(
        _D.load_ms, "--load-ms", help="Start-up load time, ms: health says loading (vLLM: nothing listens yet)."
    ),
    embedding_dim: int = typer.Option(_D.embedding_dim, "--embedding-dim", help="Length of embedding vectors."),
) -> None:
    """Run an OpenAI-compatible engine simulator (latency model, prefix cache, metrics, KV events, faults)."""
    try:
        config = SimConfig(
            host=host,
            port=port,
            models=tuple(model),
            seed=seed,
            dialect=dialect,
            mode=mode,
            block_size=block_size,
            kv_blocks=kv_blocks,
            max_batch=max_batch,
            max_model_len=max_model_len,
            output_min=output_min,
            output_max=output_max,
            ttft_ms=ttft_ms,
            prefill_ms_per_token=prefill_ms_per_token,
            itl_ms=itl_ms,
            itl_ms_per_request=itl_ms_per_request,
            time_scale=time_scale,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            kv_events=kv_events,
            kv_events_bind=kv_events_bind,
            kv_events_replay=kv_events_replay,
            kv_events_topic=kv_events_topic,
            fail_rate=fail_rate,
            fail_status=fail_status,
            stall_rate=stall_rate,
            stall_ms=stall_ms,
            stall_at=stall_at,
            crash_after=crash_after,
            crash_after_tokens=crash_after_tokens,
            load_ms=load_ms,
            embedding_dim=embedding_dim,
        )
        from opod.sim.server import serve

        serve(config, announce=lambda line: print(line, flush=True))
    except SimConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass
