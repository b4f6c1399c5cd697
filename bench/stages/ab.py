"""``python -m bench stages-ab --base DIR``: this checkout's leader against another's, the stages bench's all on.

All on is :data:`bench.stages.fleet.ALL_ON_AREAS`: tenancy, price & budget, kept bodies, the settings' guard
policy, run in the gateway (no guardrail webhook, so no process beside the leaders), and prefix routing over two
workers. The base's leader reads the same settings: a base older than the guard policies refuses them, and the run
stops naming it.

The stages bench's on/off rounds compare configurations of one build; a change to the hot path is judged
against the build before it, on a machine whose load drifts. So both leaders (each with its own workers and
zero-latency simulators) run side by side, and each round loads the two at once, with the same arrivals:
the ratio of a pair is what the change did, whatever the machine was doing then. Measured in the same
windows, a pair's ratio spreads about a third as much as when the two were measured back to back (the
machine's speed drifts from one window to the next), so a change of 2 % shows in nearly every pair
(``docs/dataplane.md``). CPU is every thread's, from ``/proc/PID/task/*/schedstat`` (nanoseconds; /proc's
``stat`` counts in 10 ms ticks, too coarse for a two-second round).

``DIR`` holds the other build's tree, e.g. ``git worktree add --detach /tmp/base main``; ``--base-python``
runs the base's leader under another interpreter (another virtual environment's ``bin/python``), so the same
tree can be set against itself on two Python versions.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench import loadgen
from bench.procs import checkout_commit
from bench.stages.fleet import ALL_ON, ALL_ON_AREAS, CONFIGS, REPO, Config, Member, Webhook, ready_all, stop_all
from bench.stages.measure import PAYLOADS

console = Console(width=None if sys.stdout.isatty() else 150)
RESULTS = REPO / "bench" / "results"
SIDES = ("base", "this")


def cpu_ns(pid: int) -> tuple[int, int]:
    """The process's CPU time in nanoseconds, every thread and the main thread (the event loop's)."""
    total = main = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                spent = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        total += spent
        if tid == str(pid):
            main = spent
    return total, main


@dataclass
class Side:
    cpu_us: list[float] = field(default_factory=list)
    main_us: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    own_p99_ms: list[float] = field(default_factory=list)
    """The p99 of the leader's own time per request, as its ``Server-Timing`` says (the engine's wait left out)."""
    answered: int = 0
    errors: int = 0


def _round(members: dict[str, Member], rate: float, seconds: float, seed: int, sides: dict[str, Side]) -> None:
    """One pair: both leaders under load at once, each at ``rate`` with the same arrivals, in two windows.

    Measured in the same windows, the two leaders share whatever the machine does meanwhile. Requests due at the
    same moment go to one leader a moment before the other, which favours one of them; so the second window turns
    that order, and the pair's figures are the two windows' together."""

    async def both(order: tuple[str, ...]) -> list[loadgen.Result]:
        return await asyncio.gather(
            *(
                loadgen.open_loop(members[name].chat_url, PAYLOADS, members[name].headers(), rate, seconds, seed)
                for name in order
            )
        )

    spent = {name: (0, 0) for name in SIDES}
    got = {name: loadgen.Result() for name in SIDES}
    for order in (SIDES, SIDES[::-1]):
        place_loops(members, order)
        before = {name: cpu_ns(members[name].pid) for name in SIDES}
        for name, window in zip(order, asyncio.run(both(order)), strict=True):
            after, (total, main) = cpu_ns(members[name].pid), spent[name]
            spent[name] = (total + after[0] - before[name][0], main + after[1] - before[name][1])
            got[name].latencies += window.latencies
            got[name].own += window.own
            got[name].errors += window.errors
    for name in SIDES:
        side, answered = sides[name], max(len(got[name].latencies), 1)
        side.cpu_us.append(spent[name][0] / answered / 1000)
        side.main_us.append(spent[name][1] / answered / 1000)
        side.p50_ms.append(got[name].pct(50) * 1000)
        side.p99_ms.append(got[name].pct(99) * 1000)
        side.own_p99_ms.append(loadgen.percentile(got[name].own, 99) * 1000)
        side.answered += len(got[name].latencies)
        side.errors += got[name].errors


def place_loops(members: dict[str, Member], order: tuple[str, ...]) -> None:
    """Each leader's event loop on a CPU of its own, the first of ``order`` on the lowest.

    A leader pins its loop to one CPU as it starts (``opod.http.cpu``), and the two leaders of a run would keep
    the CPUs they happened to take: where the machine's other work (the load generator, the simulators,
    interrupts) favours one CPU, every pair would favour the same build. The windows of a pair trade the
    CPUs, so each build spends as long on each. A leader whose loop is free (``OPOD_LOOP_CPU=off``, or a base
    from before the pin) is left free."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    for cpu, name in zip(cpus, order, strict=False):
        pid = members[name].pid  # the loop runs on the leader's main thread, whose id is the process's
        try:
            if len(os.sched_getaffinity(pid)) == 1:
                os.sched_setaffinity(pid, {cpu})
        except OSError:
            continue  # gone: the round says so by its errors


def run_pairs(
    members: dict[str, Member], rate: float, seconds: float, rounds: int, warm: float, starting: str, done: str = ""
) -> dict[str, Side]:
    """Both leaders (their processes started, nothing joined yet) given their workers, configured and checked,
    warmed, then ``rounds`` pairs at once (:func:`_round`); stopped at the end, whatever happens. ``starting`` is
    said while they start; ``done``, when given, once the rounds are over (else each round is counted as it ends)."""
    sides = {name: Side() for name in SIDES}
    try:
        with console.status(starting):
            ready_all(members)
        for member in members.values():
            asyncio.run(loadgen.open_loop(member.chat_url, PAYLOADS, member.headers(), rate, warm, 99))
        for n in range(rounds):
            _round(members, rate, seconds, n, sides)
            if not done:
                console.print(f"round {n + 1}/{rounds}")
        if done:
            console.print(done)
    finally:
        stop_all(members)
    return sides


def side_trees(base: Path) -> dict[str, Path]:
    """Each side's tree: ``base`` (checked to be an opod checkout, else refused naming ``--base``) and this one."""
    base = base.resolve()
    if not (base / "src" / "opod").is_dir():
        raise typer.BadParameter(
            f"{base} holds no src/opod: give the tree of another opod checkout", param_hint="--base"
        )
    return {"base": base, "this": REPO}


def python_version(python: str) -> str:
    """The version of the interpreter at ``python``; refused naming ``--base-python`` when it does not run."""
    try:
        done = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
        )
    except OSError as err:
        raise typer.BadParameter(f"{python} does not run: {err.strerror}", param_hint="--base-python") from None
    if done.returncode != 0:
        raise typer.BadParameter(f"{python} does not run: {done.stderr.strip()[-200:]}", param_hint="--base-python")
    return done.stdout.strip()


def ratios(sides: dict[str, Side], measure: str) -> list[float]:
    """This side's ``measure`` over the base's, round by round, sorted."""
    this, base = getattr(sides["this"], measure), getattr(sides["base"], measure)
    return sorted(t / b for t, b in zip(this, base, strict=True))


def quartiles(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3


def report(
    sides: dict[str, Side], trees: dict[str, Path], versions: dict[str, str], rate: float, seconds: float
) -> str:
    cpu = ratios(sides, "cpu_us")
    cpu_quartiles = quartiles(cpu)
    tails = ratios(sides, "p99_ms")
    tail_quartiles = quartiles(tails)
    own = ratios(sides, "own_p99_ms")
    own_quartiles = quartiles(own)
    lines = [
        f"# This checkout's leader against another's, all on ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `python -m bench {shlex.join(sys.argv[1:])}`",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end, shared with other work. "
        f"Open loop at {rate:g} req/s to each leader, {len(cpu)} rounds; in each, both leaders are loaded at once, "
        f"with the same arrivals, in two windows of {seconds:g} s (which leader a request due at the same moment "
        "goes to first turned in the second, and so did the CPUs the two leaders' event loops are pinned to). "
        "CPU: the leader's every thread, per request "
        "answered (schedstat); its idle CPU is not taken out, alike on both sides. All on: "
        f"{ALL_ON_AREAS}; each leader's guard policy was checked on one request's record before measuring.",
        "",
        "| leader | tree | commit | Python | requests | errors | CPU µs/req (median) | event loop µs/req | p50 ms "
        "| p99 ms | own p99 ms |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in SIDES:
        side = sides[name]
        med = statistics.median
        lines.append(
            f"| {name} | `{trees[name]}` | `{checkout_commit(trees[name])}` | {versions[name]} | "
            f"{side.answered} | {side.errors} | "
            f"{med(side.cpu_us):.0f} | {med(side.main_us):.0f} | {med(side.p50_ms):.2f} | {med(side.p99_ms):.2f} | "
            f"{med(side.own_p99_ms):.2f} |"
        )
    lines += [
        "",
        f"This leader's CPU per request over the base's, pair by pair: median **{statistics.median(cpu):.3f}** "
        f"(quartiles {cpu_quartiles[0]:.3f}–{cpu_quartiles[2]:.3f}; every pair: {', '.join(f'{r:.3f}' for r in cpu)}).",
        "",
        f"Its p99 latency over the base's, pair by pair: median {statistics.median(tails):.3f} "
        f"(quartiles {tail_quartiles[0]:.3f}–{tail_quartiles[2]:.3f}); a round's p99 rests on its slowest few "
        "requests, so set this against the same command run with this checkout as its own base.",
        "",
        f"Its own time's p99 over the base's (own: each answer's `Server-Timing` `opod;dur`, from the request's "
        "arrival to the answer's headers, the wait on the engine left out, so the client's and the engines' "
        f"delays are not in it), pair by pair: median {statistics.median(own):.3f} "
        f"(quartiles {own_quartiles[0]:.3f}–{own_quartiles[2]:.3f}).",
        "",
    ]
    return "\n".join(lines)


def command(
    base: Path = typer.Option(..., help="Another checkout's tree (git worktree add --detach DIR REF): the base."),
    rate: float = typer.Option(200.0, help="Requests per second to each leader, open loop (both are loaded at once)."),
    seconds: float = typer.Option(2.0, help="Seconds of each of a round's two windows."),
    rounds: int = typer.Option(12, min=1, help="Rounds: pairs, each measuring both leaders at once in two windows."),
    warm: float = typer.Option(1.0, help="Seconds of requests warming each leader first."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table goes."),
    name: str = typer.Option("stages-ab", help="The table's file name, <name>.md."),
    base_python: str = typer.Option(
        sys.executable, help="The interpreter that runs the base's leader (another virtual environment's bin/python)."
    ),
) -> None:
    """This checkout's all-on leader (tenancy, price & budget, kept bodies, the guard policy in process) against
    another checkout's: CPU per request, pair by pair."""
    trees = side_trees(base)
    pythons = {"base": base_python, "this": sys.executable}
    versions = {side: python_version(python) for side, python in pythons.items()}
    all_on = next(c for c in CONFIGS if c.name == ALL_ON)
    hook = Webhook() if all_on.areas.guardrail else None
    members: dict[str, Member] = {}
    try:
        # The leaders stop (run_pairs) before their homes in the scratch folder go: they write there until then.
        with tempfile.TemporaryDirectory(prefix="bench-stages-ab-") as scratch:
            try:
                for side in SIDES:
                    config = Config(side, side, all_on.areas, "")
                    url = hook.url if hook is not None else ""
                    members[side] = Member(config, Path(scratch), url, tree=trees[side], python=pythons[side])
            except BaseException:
                stop_all(members)
                raise
            starting = "starting both leaders, each with an opod join worker and a simulator"
            sides = run_pairs(members, rate, seconds, rounds, warm, starting)
    except RuntimeError as err:  # a leader that did not start, answer or take the settings: said, not a traceback
        console.print(f"[red]stages-ab stopped:[/] {escape(str(err))}")
        raise typer.Exit(1) from None
    finally:
        if hook is not None:
            hook.stop()
    text = report(sides, trees, versions, rate, seconds)
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.md"
    out.write_text(text)
    console.print(text)
    console.print(f"[dim]written: {out}[/]")
