"""``python -m bench idle-ab --base DIR``: what an idle leader of this checkout spends against another checkout's.

An idle leader (``opod up``, nothing sent) still runs its background work: following the store for other
leaders' changes, the batch runner, the ledger, the listeners. Both leaders (``--no-worker``, no model; with
``--worker`` an ``opod join`` worker each, whose heartbeats an idle fleet's leader gets) run side by side on
their own SQLite stores, and each round measures the two over the same seconds, so what the machine did then
weighs on both alike. CPU is every thread's, from schedstat (:func:`bench.stages.ab.cpu_ns`), in milliseconds
per second of wall time. At the end each leader must still answer ``/v1/models``: a leader that died idles at
no cost.

``DIR`` holds the other build's tree, e.g. ``git worktree add --detach /tmp/opod-base main``.
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import typer

from bench.procs import checkout_commit
from bench.stages.ab import RESULTS, SIDES, console, cpu_ns, side_trees
from bench.stages.fleet import Areas, Config, Member, stop_all


@dataclass
class Idle:
    cpu_ms_s: list[float] = field(default_factory=list)
    main_ms_s: list[float] = field(default_factory=list)
    answered: str = "not asked"


def _sample(members: dict[str, Member], order: tuple[str, ...]) -> dict[str, tuple[float, int, int]]:
    """Each leader's (time, CPU ns, event loop ns) now, in ``order``."""
    taken = {}
    for side in order:
        total, main = cpu_ns(members[side].pid)
        taken[side] = (time.monotonic(), total, main)
    return taken


def _round(members: dict[str, Member], seconds: float, n: int, sides: dict[str, Idle]) -> None:
    order = SIDES if n % 2 == 0 else tuple(reversed(SIDES))
    before = _sample(members, order)
    time.sleep(seconds)
    after = _sample(members, order)
    for side in SIDES:
        took = after[side][0] - before[side][0]
        sides[side].cpu_ms_s.append((after[side][1] - before[side][1]) / 1e6 / took)
        sides[side].main_ms_s.append((after[side][2] - before[side][2]) / 1e6 / took)


def _answers(member: Member) -> str:
    """Whether the leader still answers ``GET /v1/models`` with its admin key (it may have died idling)."""
    code = member.leader.proc.poll()
    if code is not None:
        return f"no (exited {code})"
    request = urllib.request.Request(member.url + "/v1/models", headers=member.headers())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return "yes" if answer.status == 200 else f"no ({answer.status})"
    except OSError as err:
        return f"no ({err})"


def report(sides: dict[str, Idle], trees: dict[str, Path], seconds: float, settle: float, worker: bool) -> str:
    ratios = sorted(t / b for t, b in zip(sides["this"].cpu_ms_s, sides["base"].cpu_ms_s, strict=True) if b > 0)
    med = statistics.median
    lines = [
        f"# An idle leader of this checkout against another's ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `python -m bench {shlex.join(sys.argv[1:])}`",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end, shared with other work. "
        f"Both leaders (`opod up --no-worker --no-default-models`, a SQLite store each"
        f"{', an opod join worker each' if worker else ', no worker'}) idle side by side, nothing sent; "
        f"{settle:g} s to settle, then {len(sides['this'].cpu_ms_s)} rounds of {seconds:g} s, each measuring both "
        "over the same seconds (read in turned order every round). CPU: the leader's every thread (schedstat), "
        "ms per second of wall time; event loop: its main thread alone.",
        "",
        "| leader | tree | commit | answers after the rounds | CPU ms/s (median) | event loop ms/s (median) | "
        "every round, ms/s |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for name in SIDES:
        side = sides[name]
        rounds = ", ".join(f"{x:.2f}" for x in side.cpu_ms_s)
        lines.append(
            f"| {name} | `{trees[name]}` | `{checkout_commit(trees[name])}` | {side.answered} | "
            f"{med(side.cpu_ms_s):.2f} | {med(side.main_ms_s):.2f} | {rounds} |"
        )
    if ratios:
        lines += [
            "",
            f"This leader's idle CPU over the base's, round by round: median **{med(ratios):.3f}** "
            f"(every round: {', '.join(f'{r:.3f}' for r in ratios)}).",
        ]
    lines.append("")
    return "\n".join(lines)


def command(
    base: Path = typer.Option(..., help="Another checkout's tree (git worktree add --detach DIR REF): the base."),
    seconds: float = typer.Option(10.0, help="Seconds per round; both leaders are measured over the same ones."),
    rounds: int = typer.Option(6, min=1, help="Rounds."),
    settle: float = typer.Option(5.0, help="Seconds both leaders idle before the first round (start-up's work done)."),
    worker: bool = typer.Option(False, "--worker/--no-worker", help="Join each leader with a simulator worker."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table goes."),
    name: str = typer.Option("idle-ab", help="The table's file name, <name>.md."),
) -> None:
    """This checkout's idle leader against another checkout's: CPU ms per second, round by round."""
    trees = side_trees(base)
    members: dict[str, Member] = {}
    sides = {side: Idle() for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-idle-ab-") as scratch:
        try:
            with console.status("starting both leaders"):
                for side in SIDES:
                    members[side] = Member(Config(side, side, Areas(), ""), Path(scratch), "", tree=trees[side])
                for member in members.values():
                    if worker:
                        member.join()
                    else:
                        member.listening()
            time.sleep(settle)
            for n in range(rounds):
                _round(members, seconds, n, sides)
                now = {side: sides[side].cpu_ms_s[-1] for side in SIDES}
                console.print(f"round {n + 1}/{rounds}: base {now['base']:.2f} ms/s, this {now['this']:.2f} ms/s")
            for side, member in members.items():
                sides[side].answered = _answers(member)
        finally:
            stop_all(members)  # before the homes go
    text = report(sides, trees, seconds, settle, worker)
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.md"
    out.write_text(text)
    console.print(text)
    console.print(f"[dim]written: {out}[/]")
