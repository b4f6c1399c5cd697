"""``python -m bench stages``: where each microsecond of a ``/v1`` chat request goes, and what each area adds."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench.stages import measure
from bench.stages.fleet import ALL_OFF, ALL_ON, CONFIGS, Member, Webhook, start_all, stop_all
from bench.stages.report import Run, tables, write

console = Console(width=None if sys.stdout.isatty() else 150)
RESULTS = Path(__file__).resolve().parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src")
    return git("rev-parse", "--short=12", "HEAD") + (" (src/ with uncommitted changes)" if dirty else "")


def command(
    requests: int = typer.Option(1500, help="Requests in each profiled pass (one on the CPU clock, one on the wall)."),
    rate: float = typer.Option(100.0, help="Requests per second, open loop, in the profiled passes and the rounds."),
    seconds: float = typer.Option(5.0, help="Seconds per configuration in each on/off round."),
    rounds: int = typer.Option(3, help="Interleaved on/off rounds."),
    warm: float = typer.Option(1.0, help="Seconds of requests warming each leader before the rounds."),
    timed: int = typer.Option(200, help="Sequential requests whose Server-Timing is read."),
    flames: bool = typer.Option(True, "--flames/--no-flames", help="py-spy flame graphs, when py-spy is installed."),
    flame_seconds: float = typer.Option(8.0, help="Seconds py-spy records each leader."),
    saturation_seconds: float = typer.Option(3.0, help="Seconds of the closed loop that finds a leader's saturation."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where stages.md, stages.json and SVGs go."),
) -> None:
    """A /v1 chat request's cost by stage (profiled leader), and each governance area on and off."""
    spy = measure.py_spy() if flames else None
    skipped = "" if spy else ("--no-flames was given" if not flames else "py-spy is not installed (pip install py-spy)")
    if skipped:
        console.print(f"[yellow]flame graphs skipped: {skipped}[/]")
    results_dir.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    hook = Webhook()
    members: dict[str, Member] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stages-") as scratch:
            try:  # the leaders stop before their homes in the scratch folder go: they write there until then
                with console.status(f"starting {len(CONFIGS)} leaders, each with an opod join worker and a simulator"):
                    members = start_all(CONFIGS, Path(scratch), hook.url)
                with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
                    task = progress.add_task("areas on and off: interleaved rounds", total=rounds * len(members))
                    by_config = measure.on_off(members, rate, seconds, rounds, warm, partial(progress.advance, task))
                    passes = []
                    for clock in ("cpu", "wall"):
                        task = progress.add_task(f"profiled pass, {clock} clock: requests", total=requests)
                        passes.append(
                            measure.profiled(
                                members[ALL_ON], clock, requests, rate, Path(scratch), partial(progress.advance, task)
                            )
                        )
                    with console.status("Server-Timing of sequential requests"):
                        timing = measure.server_timing(members[ALL_ON], timed)
                    drawn = []
                    if spy:
                        for name in (ALL_ON, ALL_OFF):
                            task = progress.add_task(f"py-spy on '{name}' at half its saturation: requests")
                            drawn.append(
                                measure.flame(
                                    members[name],
                                    spy,
                                    flame_seconds,
                                    saturation_seconds,
                                    results_dir,
                                    partial(progress.advance, task),
                                )
                            )
            finally:
                stop_all(members)
    finally:
        hook.stop()
    run = Run(
        command="python -m bench " + shlex.join(sys.argv[1:]),
        when=time.strftime("%Y-%m-%d %H:%M"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        commit=_commit(),
        rate=rate,
        cpu_pass=passes[0],
        wall_pass=passes[1],
        rounds=by_config,
        round_seconds=seconds,
        timing=timing,
        flames=drawn,
        flames_skipped=skipped,
        guard_checks={name: member.guard for name, member in members.items() if member.guard},
    )
    written = write(run, results_dir)
    for table in tables(run):
        console.print(table)
    console.print(f"[dim]written: {written}, stages.json" + (" and the flame graphs" if drawn else "") + "[/]")
