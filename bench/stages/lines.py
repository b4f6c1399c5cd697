"""``python -m bench lines [--base DIR]``: the lines of Python a ``/v1`` chat runs in the leader, all on.

Where a request's code goes, exactly: what each module and function runs per chat, the same from run to run
whatever the machine's load, and beside another checkout's with ``--base``. It finds work; it does not price
it, as lines differ in weight: cutting a chat's calls from 242 to 188 counted 0.949 of the lines and
measured 0.958 of the CPU, while cuts of loops and look-ups inside functions that counted 0.95 to 0.97
measured no change (``docs/dataplane.md``). ``python -m bench stages-ab`` says what a cut buys.

The leader is the stages bench's all on (:data:`bench.stages.fleet.ALL_ON_AREAS`, two workers with
zero-latency simulators); it counts with ``sys.settrace`` on its event loop's thread while the window is open
(``bench.stages.launch``), and the requests are sent slowly, as counting slows every line. What the leader
runs around requests (heartbeats, its loops) is counted in a window as long without requests and taken out,
and a line counts where it ran at least once per two requests.
With ``--base``, another checkout's leader is counted the same way, side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bench import loadgen
from bench.procs import checkout_commit
from bench.stages.ab import side_trees
from bench.stages.fleet import ALL_ON, CONFIGS, REPO, Config, Member, ready_all, stop_all
from bench.stages.measure import PAYLOADS

console = Console(width=None if sys.stdout.isatty() else 150)
RESULTS = REPO / "bench" / "results"
EVERY_OTHER = 0.5
"""A line counts when it ran at least this many times per request."""


@dataclass
class Counted:
    """One leader's count: requests answered in the window, and each line that requests ran, per request."""

    tree: Path
    answered: int
    errors: int
    per_request: dict[tuple[str, str, int, int], float] = field(default_factory=dict)
    """(file, function, its first line, line) → times run per request."""

    @property
    def lines(self) -> float:
        return sum(self.per_request.values())

    def functions(self) -> Counter[tuple[str, str, int]]:
        """Each function → lines it ran per request."""
        out: Counter[tuple[str, str, int]] = Counter()
        for (path, name, first, _), times in self.per_request.items():
            out[path, name, first] += times
        return out

    def modules(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (path, _, _, _), times in self.per_request.items():
            out[module_name(path)] += times
        return out


def module_name(path: str) -> str:
    """A file as a reader finds it: ``opod/gateway/app.py``, ``uvicorn/…``, ``asyncio/tasks.py``."""
    for marker in ("/site-packages/", "/src/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            return path.split("/", 1)[1] if marker == "/lib/python" else path
    return path


def _window(member: Member, out: Path, load: float, requests: int, rate: float) -> tuple[float, loadgen.Result | None]:
    """Open the leader's line count, send ``requests`` chats at ``rate`` (none when ``load`` is 0, only waiting as
    long), close it; the window's length in seconds, and what the load generator saw."""
    member.request_file.write_text(json.dumps({"out": str(out), "clock": "lines"}))
    opened = time.monotonic()
    os.kill(member.pid, signal.SIGUSR1)
    time.sleep(0.5)  # the handler runs at the loop's next Python step; heartbeats make one within this
    got = None
    if load:
        got = asyncio.run(loadgen.open_loop(member.chat_url, PAYLOADS, member.headers(), rate, requests / rate, 7))
    else:
        time.sleep(requests / rate)
    os.kill(member.pid, signal.SIGUSR1)
    closed = time.monotonic()
    deadline = closed + 60
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{member.config.name}: the leader wrote no line count to {out}")
        time.sleep(0.1)
    return closed - opened, got


def _counts(out: Path) -> dict[tuple[str, str, int, int], int]:
    return {(path, name, first, line): times for path, name, first, line, times in json.loads(out.read_text())}


def count(member: Member, tree: Path, requests: int, rate: float, scratch: Path) -> Counted:
    """``requests`` chats at ``rate`` with the leader's line count open; every one of them is inside the window.

    The leader's own work around requests (heartbeats, its loops) is counted in a window as long with no
    requests, and taken out line by line.
    """
    idle_out, busy_out = scratch / f"lines-{member.config.name}-idle.json", scratch / f"lines-{member.config.name}.json"
    idle_s, _ = _window(member, idle_out, 0.0, requests, rate)
    busy_s, got = _window(member, busy_out, 1.0, requests, rate)
    assert got is not None
    answered = len(got.latencies)
    if not answered:
        raise RuntimeError(f"{member.config.name}: no request was answered while counting ({got.errors} errors)")
    idle = _counts(idle_out)
    counted = Counted(tree, answered, got.errors)
    for where, times in _counts(busy_out).items():
        per_request = (times - idle.get(where, 0) * busy_s / idle_s) / answered
        if per_request >= EVERY_OTHER:
            counted.per_request[where] = per_request
    return counted


def report(counts: dict[str, Counted], rate: float, top: int) -> str:
    sides = list(counts)
    lines = [
        f"# The lines of Python a chat runs in the leader ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `python -m bench {shlex.join(sys.argv[1:])}`",
        "",
        f"All on (tenancy, price & budget, kept bodies, the guard policy in process, prefix routing over two "
        f"workers); chats at {rate:g} req/s, each leader counting with `sys.settrace` on its event loop's thread "
        f"(`bench/stages/lines.py`). The leader's own work around requests (heartbeats, its loops), counted in a window "
        f"as long with no requests, is taken out line by line, and a line counts where it ran at least once per "
        f"{1 / EVERY_OTHER:g} requests. The count does not depend on the machine's load: the same tree gives about the "
        "same figures run after run.",
        "",
        "| leader | tree | commit | Python | requests | errors | lines run per request | distinct lines | functions |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for side, got in counts.items():
        lines.append(
            f"| {side} | `{got.tree}` | `{checkout_commit(got.tree)}` | {platform.python_version()} | {got.answered} | "
            f"{got.errors} | {got.lines:.0f} | {len(got.per_request)} | {len(got.functions())} |"
        )
    if "base" in counts:
        this, base = counts["this"].lines, counts["base"].lines
        lines += [
            "",
            f"This leader runs **{this - base:+.0f}** lines per request against the base's ({this / base:.3f}).",
        ]
    by_side = {side: got.modules() for side, got in counts.items()}
    modules = Counter[str]()
    for found in by_side.values():
        modules.update(found)
    lines += ["", "## By module: lines run per request", "", "| module | " + " | ".join(sides) + " |"]
    lines.append("|---|" + "---:|" * len(sides))
    for module, _ in modules.most_common():
        lines.append(f"| {module} | " + " | ".join(f"{by_side[s][module]:.1f}" for s in sides) + " |")
    shown = counts["this"]
    lines += [
        "",
        f"## The {top} functions of this leader that run the most lines per request",
        "",
        "| function | lines run per request | distinct lines |",
        "|---|---:|---:|",
    ]
    distinct = Counter(where[:3] for where in shown.per_request)
    for (path, name, first), times in shown.functions().most_common(top):
        lines.append(f"| `{name}` ({module_name(path)}:{first}) | {times:.1f} | {distinct[path, name, first]} |")
    return "\n".join(lines) + "\n"


def command(
    base: Path | None = typer.Option(None, help="Another checkout's tree to count beside this one (git worktree add)."),
    requests: int = typer.Option(400, min=1, help="Chats counted per leader."),
    rate: float = typer.Option(100.0, help="Requests per second while counting (counting slows the leader)."),
    top: int = typer.Option(30, min=1, help="Functions listed."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table goes."),
    name: str = typer.Option("lines", help="The table's file name, <name>.md."),
) -> None:
    """The lines of Python an all-on leader runs per chat (and another checkout's, with --base)."""
    trees = side_trees(base) if base is not None else {"this": REPO}
    all_on = next(c for c in CONFIGS if c.name == ALL_ON)
    members: dict[str, Member] = {}
    counts: dict[str, Counted] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-lines-") as scratch:
            try:  # the leaders stop before their homes in ``scratch`` are removed: they write there until then
                with console.status("starting the leaders, each with two opod join workers and simulators"):
                    for side, tree in trees.items():
                        members[side] = Member(Config(side, side, all_on.areas, ""), Path(scratch), tree=tree)
                    ready_all(members)
                for side, member in members.items():
                    asyncio.run(loadgen.open_loop(member.chat_url, PAYLOADS, member.headers(), rate, 1.0, 99))
                    with console.status(f"{side}: counting the lines of {requests} chats"):
                        counts[side] = count(member, trees[side], requests, rate, Path(scratch))
            finally:
                stop_all(members)
    except RuntimeError as err:
        console.print(f"[red]lines stopped:[/] {escape(str(err))}")
        raise typer.Exit(1) from None
    text = report(counts, rate, top)
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.md"
    out.write_text(text)
    console.print(text)
    console.print(f"[dim]written: {out}[/]")
