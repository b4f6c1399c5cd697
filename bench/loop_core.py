"""``python -m bench loop-core``: what the leader's CPU per request owes to the other work on its event loop's CPU.

The leader pins its event loop to one CPU (``opod.http.cpu``). Between two requests the loop sleeps, and what
else runs on that CPU meanwhile (the engines, their workers, the clients) takes its caches; the next request
finds its code and objects in memory again. This bench measures that directly: ``python -m bench compare``'s
latency fleet (a leader with every governance area on, four ``opod join`` workers each starting a simulator),
loaded at one open-loop rate, while the other processes are placed four ways in turn, round after round:

- **shared**: the workers, engines and the load generator free on every CPU, as ``OPOD_ENGINE_CPUS=all`` leaves them;
- **engines off**: the engines on the other CPUs, the workers and the load generator free;
- **workers and engines off**: the workers too (their heartbeats, the KV events their engines publish), as a worker
  on a leader's machine keeps itself and its engines wherever a CPU is left (``opod.http.cpu``);
- **workers, engines and client off**: the load generator too, as clients on other machines would be.

Each placement moves every thread of those processes (``sched_setaffinity``); the leader is left as it placed itself. CPU is the leader's, every thread (schedstat), per request answered; the table gives each placement's
median over the rounds and its ratio to the shared one measured in the same rounds.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console

from bench import loadgen
from bench.compare import governance
from bench.plumbing.cli import Measured
from bench.procs import checkout_commit, process_tree
from bench.routing import fleet as fleet_mod
from bench.routing import workloads
from bench.routing.fleet import Fleet, SimProfile
from bench.stages.ab import cpu_ns
from bench.tables import md_table, save_figure

console = Console()
RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PLACEMENTS = {
    "shared": "workers, engines and load generator free on every CPU (as OPOD_ENGINE_CPUS=all leaves them)",
    "engines off": "engines on the other CPUs; workers and the load generator free",
    "workers and engines off": "workers and engines on the other CPUs; the load generator free",
    "workers, engines and client off": "workers, engines and the load generator on the other CPUs",
}


def loop_cpu(pid: int) -> int | None:
    """The CPU the leader's event loop (its main thread) is pinned to; ``None`` when it runs free."""
    allowed = os.sched_getaffinity(pid)
    return next(iter(allowed)) if len(allowed) == 1 else None


def place(pids: list[int], cpus: set[int]) -> None:
    """Every thread of each process on ``cpus`` (threads made later take their maker's)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass  # ended meanwhile


def engine_processes(fleet: Fleet) -> list[int]:
    """Every process the workers started (the engines)."""
    return [pid for worker in fleet.workers.values() for pid in process_tree(worker.proc.pid)[1:]]


def worker_processes(fleet: Fleet) -> list[int]:
    return [worker.proc.pid for worker in fleet.workers.values()]


def command(
    rate: float = typer.Option(427.0, help="Requests per second, open loop (compare's half of direct saturation)."),
    seconds: float = typer.Option(8.0, help="Seconds per placement and round."),
    rounds: int = typer.Option(3, min=1, help="Rounds; each measures every placement in turn."),
    warm: float = typer.Option(3.0, help="Seconds of requests before the rounds."),
    workers: int = typer.Option(4, min=1, help="opod join workers, one simulator each."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table and plot go."),
    name: str = typer.Option("loop-core", help="The table's file name, <name>.md."),
) -> None:
    """The leader's CPU per request with the engines and the clients on its event loop's CPU, and off it."""
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        console.print(
            f"[red]loop-core needs two CPUs or more to place processes apart; this process has {len(everything)}[/]"
        )
        raise typer.Exit(1)
    scratch = Path(tempfile.mkdtemp(prefix="loop-core-"))
    began = time.time()
    with console.status("starting the fleet") as status:
        fleet = fleet_mod.start(scratch / "fleet", workers, SimProfile(), on_step=status.update)
    try:
        gov = governance.enable(fleet, scratch, ["opod"])
        leader = fleet.leader.proc.pid
        pinned = loop_cpu(leader)
        if pinned is None:
            console.print(
                "[red]the leader's event loop is not pinned to one CPU (OPOD_LOOP_CPU=off?): nothing to keep off[/]"
            )
            raise typer.Exit(1)
        others = everything - {pinned}
        engines, workers_ = engine_processes(fleet), worker_processes(fleet)
        url = fleet.url + "/v1/chat/completions"
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {gov.key}"}
        bodies = workloads.distinct_chat_bodies(4096, 8)
        asyncio.run(loadgen.open_loop(url, bodies, headers, rate, warm))
        out = {placement: Measured() for placement in PLACEMENTS}
        for n in range(rounds):
            names = list(PLACEMENTS)
            for placement in names[n % len(names) :] + names[: n % len(names)]:
                place(engines, everything if placement == "shared" else others)
                place(workers_, others if placement.startswith("workers") else everything)
                place([os.getpid()], others if placement.endswith("client off") else everything)
                before = cpu_ns(leader)[0]
                got = asyncio.run(loadgen.open_loop(url, bodies, headers, rate, seconds, n))
                spent = cpu_ns(leader)[0] - before
                side = out[placement]
                side.requests += len(got.latencies)
                side.errors += got.errors
                side.cpu_us.append(spent / max(len(got.latencies), 1) / 1000)
                side.p50_ms.append(got.pct(50) * 1000)
                side.p99_ms.append(got.pct(99) * 1000)
                console.print(f"round {n + 1}/{rounds}, {placement}: leader CPU {side.cpu_us[-1]:.0f} µs/req")
        place([os.getpid()], everything)
    finally:
        fleet.stop()
    results_dir.mkdir(parents=True, exist_ok=True)
    text = report(out, rate, seconds, rounds, pinned, workers, began)
    (results_dir / f"{name}.md").write_text(text)
    plot(out, results_dir / f"{name}.png")
    console.print(text)
    console.print(f"[dim]written: {results_dir / name}.md, .png[/]")


def report(
    out: dict[str, Measured], rate: float, seconds: float, rounds: int, pinned: int, workers: int, began: float
) -> str:
    shared = out["shared"].cpu_us
    body = []
    for placement, side in out.items():
        ratios = [cpu / base for cpu, base in zip(side.cpu_us, shared, strict=True)]
        body.append(
            [
                placement,
                PLACEMENTS[placement],
                str(side.requests),
                str(side.errors),
                f"{statistics.median(side.cpu_us):.0f}",
                f"{min(side.cpu_us):.0f}–{max(side.cpu_us):.0f}",
                f"{statistics.median(ratios):.3f}",
                f"{statistics.median(side.p50_ms):.2f}",
                f"{statistics.median(side.p99_ms):.2f}",
            ]
        )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(began))
    lines = [
        f"# The leader's CPU per request, with others on its event loop's CPU and off it ({when})",
        "",
        f"Command: `python -m bench loop-core --rate {rate:g} --seconds {seconds:g} --rounds {rounds}`",
        "",
        f"Commit `{checkout_commit(ROOT)}`; {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the end. `compare`'s latency fleet "
        f"(a leader with every governance area on, {workers} `opod join` workers each starting a simulator), open loop "
        f"at {rate:g} req/s, {seconds:g} s per placement and round, the placements' order turned each round. The "
        f"leader's event loop was pinned to CPU {pinned}; each placement moved every thread of the processes it names. CPU: the leader's every thread (schedstat) per request answered; the ratio "
        "is each round's against the shared placement's in the same round, its median over the rounds.",
        "",
        *md_table(
            [
                "placement",
                "what ran where",
                "requests",
                "errors",
                "leader CPU µs/req (median)",
                "spread over rounds",
                "against shared",
                "p50 ms",
                "p99 ms",
            ],
            body,
        ),
        "",
    ]
    return "\n".join(lines)


def plot(out: dict[str, Measured], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(out)
    medians = [statistics.median(out[n].cpu_us) for n in names]
    ax.bar(
        [n.replace(" and ", " &\n").replace(", ", ",\n") for n in names],
        medians,
        color=["#888888", "#4c72b0", "#8172b2", "#55a868"],
    )
    for x, value in enumerate(medians):
        ax.text(x, value, f"{value:.0f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("leader CPU µs per request")
    ax.set_title("What runs on the leader's event loop CPU")
    return save_figure(fig, ax, path, 8)
