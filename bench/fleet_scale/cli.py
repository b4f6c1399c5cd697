"""``python -m bench fleet-scale``: the options, the progress lines, and the hand-off to the runner and the report."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench.fleet_scale import planner, report, runner
from bench.fleet_scale.runner import Settings

console = Console(width=200)
RESULTS = Path(__file__).resolve().parent.parent / "results"


def command(
    quick: bool = typer.Option(False, "--quick", help="100 nodes only (about 2 minutes)."),
    nodes: list[int] = typer.Option(
        None, "--nodes", min=1, max=5000, help="Fleet sizes to run (repeat the option) [default: 100 300 1000]."
    ),
    models: int = typer.Option(500, min=1, help="Models added, and placed in one reconciler pass."),
    cpu_seconds: float = typer.Option(
        20.0, min=2.0, help="Seconds the leader's CPU is measured while the fleet only heartbeats."
    ),
    requests: int = typer.Option(200, min=10, help="GETs of each of /api/v1/summary and /api/v1/nodes."),
    latency_seconds: float = typer.Option(15.0, min=1.0, help="Seconds those GETs are paced over."),
    after_seconds: float = typer.Option(
        10.0, min=1.0, help="Seconds the leader's CPU is measured once the replicas are ready."
    ),
    results: Path = typer.Option(RESULTS, help="Where fleet-scale.md and fleet-scale.png go."),
    keep: bool = typer.Option(False, help="Keep the leaders' homes and the swarm logs (their path is printed)."),
) -> None:
    """One leader with simulated nodes of 8 GPUs that only heartbeat: the leader's CPU, one reconciler pass placing 500 models, and summary and nodes latency.

    For each fleet size a fresh `opod up --no-worker --engine sim` (SQLite, its own home) and one process of simulated nodes speaking the worker protocol (register with a node token, a signed heartbeat every 5 s). Results: bench/results/fleet-scale.md and fleet-scale.png. The whole run takes about 8 minutes (quick: about 2).
    """
    sizes = sorted(set(nodes or ([100] if quick else [100, 300, 1000])))
    settings = Settings(
        models=models,
        cpu_seconds=cpu_seconds,
        requests=requests,
        latency_seconds=latency_seconds,
        after_seconds=after_seconds,
    )
    started, load = time.monotonic(), os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="opod-fleet-scale-"))

    def step(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.0f}s[/] {escape(text)}")

    measured = []
    for n in sizes:
        try:
            measured.append(runner.run_size(n, settings, scratch / f"n{n}", step))
        except RuntimeError as err:
            console.print(f"[red]{n} nodes did not run:[/] {escape(str(err))}")
            raise typer.Exit(1) from None
    placements = {}
    for n in sizes:
        step(f"Planner in-process: {n} nodes, {models} models")
        placements[n] = planner.run(n, models)
    run = report.Run(measured, placements, settings, time.monotonic() - started, quick, load)
    path = report.write(run, results)
    console.print(report.rich_table(run))
    for line in report.goals(run):
        console.print(line.replace("**", ""))
    if report.growth(run):
        console.print(report.growth(run))
    for s in measured:
        for note in s.notes:
            console.print(f"[yellow]{s.nodes} nodes:[/] {escape(note)}")
    if keep:
        console.print(f"[dim]homes and swarm logs kept in {scratch}[/]")
    else:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    console.print(f"[dim]{run.seconds / 60:.1f} min; written: {path} and fleet-scale.png beside it[/]")
