"""``python -m bench routing``: the options, the progress bar, and the hand-off to the runner and the report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench.progress import steps
from bench.routing import peers, report, runner
from bench.routing.fleet import SimProfile
from bench.routing.runner import PATHS, Settings
from bench.routing.workloads import PrefixShape

console = Console(width=200)
RESULTS = Path(__file__).resolve().parent.parent / "results"

QUICK = {
    # A smoke run: every path and workload, a few minutes in all.
    "concurrency": (1, 16, 64, 256),
    "closed_seconds": 2.0,
    "loads": (0.25, 0.5),
    "open_seconds": 3.0,
    "stream_seconds": 4.0,
    "prefix_seconds": 10.0,
    "drain": 30.0,
}
FULL = {
    "concurrency": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "closed_seconds": 5.0,
    "loads": (0.1, 0.25, 0.5, 0.75),
    "open_seconds": 10.0,
    "stream_seconds": 10.0,
    "prefix_seconds": 60.0,
    "drain": 60.0,
}


def command(
    quick: bool = typer.Option(
        False, "--quick", help="Smoke run: fewer concurrency levels and loads, short phases (about 5 minutes)."
    ),
    paths: list[str] = typer.Option(
        list(PATHS), "--path", help="Paths to run (repeat the option); direct always runs: " + ", ".join(PATHS) + "."
    ),
    workers: int = typer.Option(8, min=1, max=32, help="Simulator workers (opod join processes, one engine each)."),
    seed: int = typer.Option(0, help="Seed for every workload and the engines: the same seed sends the same requests."),
    concurrency: list[int] = typer.Option(
        None,
        help="Closed-loop concurrency levels for workload 1 (repeat) (quick: 1 16 64 256; full: 1…256 by powers of 2).",
    ),
    closed_seconds: float = typer.Option(
        None, min=0.5, help="Seconds measured per concurrency level (quick 2, full 5)."
    ),
    loads: list[float] = typer.Option(
        None,
        help="Open-loop offered loads for workload 1, as fractions of the direct path's capacity (repeat) (quick 0.25 0.5; full 0.1 0.25 0.5 0.75).",
    ),
    open_seconds: float = typer.Option(None, min=0.5, help="Seconds of arrivals per offered load (quick 3, full 10)."),
    stream_rate: float = typer.Option(10.0, min=0.1, help="Workload 2: streamed requests per second (Poisson)."),
    stream_seconds: float = typer.Option(None, min=0.5, help="Workload 2: seconds of arrivals (quick 4, full 10)."),
    stream_tokens: int = typer.Option(32, min=2, help="Workload 2: answer tokens per streamed request."),
    prefix_rate: float = typer.Option(
        96.0,
        min=0.1,
        help="Workload 3: offered requests per second, all sessions together (96: about twice what round robin can carry on the default fleet, llm-d's comparison point).",
    ),
    prefix_seconds: float = typer.Option(
        None, min=1.0, help="Workload 3: seconds during which sessions start (quick 10, full 60)."
    ),
    groups: int = typer.Option(16, min=1, help="Workload 3: distinct long system prompts."),
    system_tokens: int = typer.Option(1000, min=16, help="Workload 3: tokens per system prompt."),
    turns: int = typer.Option(3, min=1, help="Workload 3: turns per user session."),
    output_tokens: int = typer.Option(32, min=1, help="Workload 3: answer tokens per request."),
    ttft_slo: float = typer.Option(
        2.0, min=0.0, help="Workload 3: a request counts toward goodput when its TTFT is at most this many seconds."
    ),
    kv_blocks: int = typer.Option(
        384, min=16, help="KV blocks per engine (16 tokens each): the cache a router can exploit."
    ),
    max_num_seqs: int = typer.Option(
        64,
        min=1,
        help="Requests each engine runs at once; more wait in its queue (high, so routers, not engine slots, bound workload 1).",
    ),
    prefill_ms_per_token: float = typer.Option(0.5, min=0.0, help="Engine prefill cost per uncached prompt token, ms."),
    itl_ms: float = typer.Option(
        25.0, min=0.0, help="Engine time per generated token, ms (plus 0.2 ms per running request)."
    ),
    drain: float = typer.Option(
        None, min=1.0, help="Seconds an open loop waits for answers after its last send (quick 30, full 60)."
    ),
    peers_dir: Path = typer.Option(peers.DEFAULT_DIR, help="Where the peers' virtual environments live."),
    results: Path = typer.Option(RESULTS, help="Where routing.md and the plots go."),
) -> None:
    """Routing side by side in one run: direct, opod (prefix policy and round robin), LiteLLM, vllm-router (kv_aware and cache_aware), sglang-router.

    All paths reach the same simulator engines, started by opod's workers. Workload 1: short chat, closed loop (req/s at saturation) and open loop (latency added over direct). Workload 2: streamed chat (TTFT and inter-token latency added). Workload 3: shared-prefix multi-turn sessions (TTFT p50/p90, output tokens/s, cache-hit rate against an oracle, goodput, error rate). Results: bench/results/routing.md and routing-*.png.

    The first run installs the peers into their own virtual environments under --peers-dir (LiteLLM about 45-75 s, each Rust router about 15 s); later runs reuse them. A peer that cannot be installed or started is reported with the reason.
    """
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise typer.BadParameter(
            f"unknown path {', '.join(unknown)}; choose from {', '.join(PATHS)}", param_hint="--path"
        )
    preset = QUICK if quick else FULL

    def pick(value, key):
        return preset[key] if value is None or value == [] else value

    shape = PrefixShape(
        groups=groups,
        system_tokens=system_tokens,
        output_tokens=output_tokens,
        turns=turns,
        rate=prefix_rate,
        seconds=pick(prefix_seconds, "prefix_seconds"),
    )
    profile = SimProfile(
        kv_blocks=kv_blocks,
        max_num_seqs=max_num_seqs,
        prefill_ms_per_token=prefill_ms_per_token,
        itl_ms=itl_ms,
        itl_ms_per_request=0.2,
        seed=seed,
    )
    needed = (shape.system_tokens + shape.turns * 120 + shape.output_tokens) // profile.block_size + 2
    if needed > profile.kv_blocks:
        raise typer.BadParameter(
            f"a workload-3 request needs about {needed} KV blocks but an engine holds {kv_blocks}; "
            "raise --kv-blocks or lower --system-tokens",
            param_hint="--kv-blocks",
        )
    settings = Settings(
        workers=workers,
        seed=seed,
        concurrency=tuple(sorted(set(pick(concurrency, "concurrency")))),
        closed_seconds=pick(closed_seconds, "closed_seconds"),
        loads=tuple(pick(loads, "loads")),
        open_seconds=pick(open_seconds, "open_seconds"),
        stream_rate=stream_rate,
        stream_seconds=pick(stream_seconds, "stream_seconds"),
        stream_tokens=stream_tokens,
        prefix=shape,
        ttft_slo=ttft_slo,
        drain=pick(drain, "drain"),
        profile=profile,
        paths=tuple(paths),
        peers_dir=peers_dir,
        quick=quick,
    )
    with steps(console) as (step, say):
        try:
            result = runner.run(settings, step, say)
        except RuntimeError as err:
            # The fleet itself did not come up: nothing to compare, so say why and stop.
            console.print(f"[red]the simulator fleet did not start:[/] {escape(str(err))}")
            raise typer.Exit(1) from None
    path = report.write(result, results)
    console.print(report.rich_table(result))
    for p in result.paths:
        if not p.ran:
            console.print(f"[yellow]{p.key} not run:[/] {escape(p.reason)}")
        for note in p.notes:
            console.print(f"[dim]{p.key}: {escape(note)}[/]")
    console.print(
        f"[dim]oracle cache-hit rate {result.oracle.hit_rate:.1%}; {result.cores} CPU cores; {result.seconds / 60:.1f} min; "
        f"written: {path} and routing-*.png beside it[/]"
    )
