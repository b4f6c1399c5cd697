"""``python -m bench compare``: the options, the progress bar, and the hand-off to the runner and the report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench.compare import report, runner
from bench.compare.runner import CHOICES, PATHS, Settings
from bench.progress import steps
from bench.routing import peers

console = Console(width=200)
RESULTS = Path(__file__).resolve().parent.parent / "results"


def command(
    paths: list[str] = typer.Option(
        list(PATHS),
        "--path",
        help="Paths to run (repeat the option); direct always runs: "
        + ", ".join(CHOICES)
        + ". By default all but opod-webhook: opod with the same governance but its guardrail the policy file's "
        "webhook (its own process) in place of the guard policy opod runs in process.",
    ),
    workers: int = typer.Option(4, min=1, max=16, help="Simulator engines, each started by an `opod join` worker."),
    rounds: int = typer.Option(3, min=1, help="Interleaved rounds of each latency measurement."),
    concurrency: int = typer.Option(8, min=1, help="Clients of the chat and streamed-chat closed loops."),
    seconds: float = typer.Option(8.0, min=0.2, help="Seconds measured per path and round at that concurrency."),
    stream_tokens: int = typer.Option(16, min=2, help="Answer tokens of a streamed chat."),
    capacity_level: list[int] = typer.Option(
        [128, 256], help="Concurrencies of direct's saturation on the latency fleet (repeat)."
    ),
    capacity_seconds: float = typer.Option(3.0, min=0.2, help="Seconds per concurrency of direct's saturation."),
    load_fraction: float = typer.Option(0.5, min=0.01, max=1.0, help="The open loop's rate: this share of direct's."),
    open_seconds: float = typer.Option(5.0, min=0.2, help="Seconds of open-loop arrivals per path and round."),
    zero_level: list[int] = typer.Option(
        [32, 128], help="Concurrencies of the saturation rounds, engines answering at once (repeat)."
    ),
    zero_seconds: float = typer.Option(3.0, min=0.2, help="Seconds per saturation level, path and round."),
    zero_rounds: int = typer.Option(2, min=1, help="Interleaved rounds of the saturation levels."),
    seed: int = typer.Option(0, help="Seed of the arrivals and the engines."),
    peers_dir: Path = typer.Option(peers.DEFAULT_DIR, help="Where sglang-router's virtual environment lives."),
    results: Path = typer.Option(RESULTS, help="Where the table and plots go."),
    name: str = typer.Option("compare", help="The table's file name, <name>.md, and its plots' prefix."),
) -> None:
    """opod with every governance area on, side by side with direct and sglang-router, on the same simulator engines.

    opod's guardrail is the settings' guard policy, run in the leader; --path opod-webhook adds opod with the policy
    file's guardrail webhook in its place. Added latency (p50, p99) at concurrency 8, chat and streamed, and at half of
    direct's saturation (open loop), each path measured in rounds interleaved with direct; the router's CPU per
    request; and saturation with engines that answer at once. About 8 minutes on two cores. Results:
    bench/results/compare.md and compare-*.png.
    """
    unknown = [p for p in paths if p not in CHOICES]
    if unknown:
        raise typer.BadParameter(
            f"unknown path {', '.join(unknown)}; choose from {', '.join(CHOICES)}", param_hint="--path"
        )
    settings = Settings(
        workers=workers,
        rounds=rounds,
        concurrency=concurrency,
        seconds=seconds,
        stream_tokens=stream_tokens,
        capacity_levels=tuple(sorted(set(capacity_level))),
        capacity_seconds=capacity_seconds,
        load_fraction=load_fraction,
        open_seconds=open_seconds,
        zero_levels=tuple(sorted(set(zero_level))),
        zero_seconds=zero_seconds,
        zero_rounds=zero_rounds,
        seed=seed,
        paths=tuple(dict.fromkeys(["direct", *paths])),
        peers_dir=peers_dir,
    )
    with steps(console) as (step, say):
        try:
            result = runner.run(settings, step, say)
        except RuntimeError as err:
            console.print(f"[red]the compare run stopped:[/] {escape(str(err))}")
            raise typer.Exit(1) from None
    path = report.write(result, results, name)
    console.print(report.rich_table(result))
    for note in report.notes(result):
        console.print(f"[dim]{escape(note)}[/]")
    console.print(f"[dim]{result.seconds / 60:.1f} min; written: {path} and {name}-*.png beside it[/]")
