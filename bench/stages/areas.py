"""``python -m bench stages-areas``: what each governance area costs the all-on leader, each weighed at once.

The stages bench's on/off table measures each configuration in a window of its own, so a figure of a few
percent drifts with the machine. Here each area is weighed the way ``stages-ab`` weighs a change: two leaders
of this checkout, side by side, loaded at once with the same arrivals (``bench.stages.ab``'s rounds); one is
all on, the other all on without that area. The ratio of a pair is the area's share of the all-on leader's
CPU, whatever the machine did meanwhile.

The areas weighed are those that can be taken out of all on alone: price & budget, kept bodies, the guard
policy (run in the gateway) and prefix routing (its policy over two workers, against one worker without it, as
the stages bench sets it). Tenancy is not: a budget, a retention entry or a guard policy attached to a project
needs the project's key, so without it the others change too (the stages bench's on/off table has its cost
against nothing).
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench.procs import checkout_commit
from bench.stages.ab import RESULTS, SIDES, Side, quartiles, ratios, run_pairs
from bench.stages.fleet import ALL_ON, ALL_ON_AREAS, CONFIGS, REPO, Config, Member, stop_all

console = Console(width=None if sys.stdout.isatty() else 150)

AREAS = {
    "budget": "price & budget (a price for the model, a budget on the project)",
    "bodies": "kept bodies (retention of request and answer bodies)",
    "guard_policy": "the guard policy (in process: pii and pattern checks on the request and a whole answer)",
    "routing": "prefix routing (the prefix policy over two workers, against one worker without it)",
}
"""The areas that can be taken out of all on alone (``Areas`` field → what it is, as the table says it)."""


@dataclass
class Weighed:
    area: str
    sides: dict[str, Side]

    @property
    def ratios(self) -> list[float]:
        """Without the area over all on, pair by pair, sorted."""
        return ratios(self.sides, "cpu_us")


def weigh(area: str, rate: float, seconds: float, rounds: int, warm: float) -> Weighed:
    """All on against all on without ``area``, both leaders of this checkout, ``rounds`` pairs at once."""
    all_on = next(c for c in CONFIGS if c.name == ALL_ON)
    configs = {
        "base": Config("base", "all on", all_on.areas, ""),
        "this": Config("this", f"all on without {area}", replace(all_on.areas, **{area: False}), ""),
    }
    members: dict[str, Member] = {}
    # The leaders stop (run_pairs) before their homes in the scratch folder go: they write there until then.
    with tempfile.TemporaryDirectory(prefix=f"bench-stages-areas-{area}-") as scratch:
        try:
            for side in SIDES:
                members[side] = Member(configs[side], Path(scratch), tree=REPO)
        except BaseException:
            stop_all(members)
            raise
        starting = f"{area}: starting both leaders, each with its workers and simulators"
        sides = run_pairs(members, rate, seconds, rounds, warm, starting, done=f"{area}: {rounds} rounds")
    return Weighed(area, sides)


def report(weighed: list[Weighed], rate: float, seconds: float, rounds: int) -> str:
    med = statistics.median
    lines = [
        f"# What each governance area costs the all-on leader, weighed at once ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `python -m bench {shlex.join(sys.argv[1:])}`",
        "",
        f"Commit measured: `{checkout_commit(REPO)}`. Machine: {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at the end, shared with other work. For each area, two leaders of this checkout "
        f"side by side, each with its own two `opod join` workers and zero-latency simulators: one all on "
        f"({ALL_ON_AREAS}), the other all on without the area. {rounds} rounds; in each, both are loaded at once "
        f"at {rate:g} req/s with the same arrivals, in two windows of {seconds:g} s (`python -m bench stages-ab`'s "
        "rounds). CPU: the leader's every thread per request answered (schedstat). The area's share is one minus the "
        "pairs' median ratio; its µs per request, that share of the all-on leader's median.",
        "",
        "| area taken out | requests (all on / without) | errors | all on CPU µs/req | without CPU µs/req "
        "| without / all on, pair by pair: median (quartiles) | share of all on's CPU | ≈ µs per request |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for w in weighed:
        on, off, pairs = w.sides["base"], w.sides["this"], w.ratios
        q = quartiles(pairs)
        share = 1 - med(pairs)
        lines.append(
            f"| {AREAS[w.area]} | {on.answered} / {off.answered} | {on.errors + off.errors} | {med(on.cpu_us):.0f} "
            f"| {med(off.cpu_us):.0f} | {med(pairs):.3f} ({q[0]:.3f}–{q[2]:.3f}) | {share:.1%} "
            f"| {share * med(on.cpu_us):.0f} |"
        )
    lines += ["", "Every pair's ratio:", ""]
    lines += [f"- {w.area}: {', '.join(f'{r:.3f}' for r in w.ratios)}" for w in weighed]
    lines.append("")
    return "\n".join(lines)


def command(
    area: list[str] = typer.Option(
        list(AREAS), "--area", help=f"An area to weigh (repeat for several): {', '.join(AREAS)}."
    ),
    rate: float = typer.Option(213.0, help="Requests per second to each leader, open loop (both are loaded at once)."),
    seconds: float = typer.Option(2.0, help="Seconds of each of a round's two windows."),
    rounds: int = typer.Option(16, min=1, help="Rounds per area: pairs, each measuring both leaders at once."),
    warm: float = typer.Option(1.0, help="Seconds of requests warming each leader first."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table goes."),
    name: str = typer.Option("stages-areas", help="The table's file name, <name>.md."),
) -> None:
    """Each governance area's share of the all-on leader's CPU: all on against all on without it, at once."""
    unknown = [a for a in area if a not in AREAS]
    if unknown:
        raise typer.BadParameter(
            f"{', '.join(unknown)}: not an area that can be taken out alone; choose from {', '.join(AREAS)}",
            param_hint="--area",
        )
    weighed: list[Weighed] = []
    try:
        for one in dict.fromkeys(area):
            weighed.append(weigh(one, rate, seconds, rounds, warm))
    except RuntimeError as err:  # a leader that did not start, answer or take the settings: said, not a traceback
        console.print(f"[red]stages-areas stopped:[/] {escape(str(err))}")
        raise typer.Exit(1) from None
    text = report(weighed, rate, seconds, rounds)
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.md"
    out.write_text(text)
    console.print(text)
    console.print(f"[dim]written: {out}[/]")
