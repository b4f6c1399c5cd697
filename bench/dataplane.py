"""The data plane's cost, side by side in one run: direct to the engine, and through opod.

1. In front of the simulator (no latency of its own): the direct path's capacity
   and opod's (closed loop), then an open loop with Poisson arrivals at half
   the slower one's, direct and through opod, and the latency opod adds at
   p50/p90/p99: a load both paths carry, so queueing does not stand in for cost.
2. In front of the real llama-server with SmolLM2 on the CPU: streamed tokens
   per second direct and through opod, runs interleaved so drift hits both.

Both paths reach the same engine process: opod's worker logs the engine's
address, and the direct path uses it.
"""

from __future__ import annotations

import asyncio
import json
import platform
import tempfile
import time
import urllib.request
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from bench import loadgen
from bench.ports import free_port
from bench.procs import Proc, wait_http

console = Console()
RESULTS = Path(__file__).parent / "results"


def _admin(url: str, key: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _start_up(home: Path, engine: str, flags: dict | None = None) -> tuple[Proc, str, str, str]:
    port, admin = free_port(), free_port()
    env = {"OPOD_ENGINE_FLAGS": json.dumps(flags)} if flags else {}
    proc = Proc(
        [
            "up",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin}",
            "--worker-listen",
            f"127.0.0.1:{free_port()}",
            "--engine",
            engine,
            "--no-default-models",
        ],
        home,
        env=env,
    )
    proc.wait_for("OpenAI API on", 60)
    key = (home / "admin.key").read_text().strip()
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", key


def _engine_url(proc: Proc, model: str, timeout: float = 180) -> str:
    return proc.wait_for(rf"{model} serving on (http://127\.0\.0\.1:\d+)", timeout).group(1)


def run_sim(seconds: float, concurrency: int, progress: Progress, flags: dict, label: str) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        proc, url, admin, key = _start_up(Path(scratch), "sim", flags)
        try:
            _admin(admin, key, "POST", "/api/v1/models", {"name": "sim-chat", "profiles": [{"engine": "sim"}]})
            direct = _engine_url(proc, "sim-chat", 60)
            wait_http(url + "/readyz")
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            body = json.dumps(
                {"model": "sim-chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
            ).encode()
            task = progress.add_task(f"simulator ({label}): capacity (closed loop)", total=2)
            cap_direct = asyncio.run(
                loadgen.closed_loop(direct + "/v1/chat/completions", body, headers, concurrency, seconds)
            )
            progress.advance(task)
            cap_opod = asyncio.run(
                loadgen.closed_loop(url + "/v1/chat/completions", body, headers, concurrency, seconds)
            )
            progress.advance(task)
            rate = min(cap_direct.rps, cap_opod.rps) / 2
            total = int(rate * seconds) * 2
            task = progress.add_task(f"simulator ({label}): open loop at {rate:.0f} req/s", total=total)

            def tick(task: TaskID = task) -> None:
                progress.advance(task)

            open_direct = asyncio.run(
                loadgen.open_loop(direct + "/v1/chat/completions", body, headers, rate, seconds, seed=1, tick=tick)
            )
            open_opod = asyncio.run(
                loadgen.open_loop(url + "/v1/chat/completions", body, headers, rate, seconds, seed=1, tick=tick)
            )
        finally:
            proc.stop()
    return {
        "label": label,
        "cap_direct": cap_direct,
        "cap_opod": cap_opod,
        "rate": rate,
        "open_direct": open_direct,
        "open_opod": open_opod,
    }


def run_llama(runs: int, max_tokens: int, progress: Progress) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        proc, url, admin, key = _start_up(Path(scratch), "llamacpp")
        try:
            _admin(admin, key, "POST", "/api/v1/models", {"name": "smollm2-135m-instruct"})
            direct = _engine_url(proc, "smollm2-135m-instruct")
            wait_http(url + "/readyz")
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            body = {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
            task = progress.add_task("llama-server: streamed tokens/s", total=2 * runs)
            totals = {"direct": [0, 0.0], "opod": [0, 0.0]}
            asyncio.run(loadgen.stream_tokens(direct + "/v1/chat/completions", body, headers, 1))  # warm the engine
            for _ in range(runs):
                for name, base in (("direct", direct), ("opod", url)):
                    tokens, spent = asyncio.run(loadgen.stream_tokens(base + "/v1/chat/completions", body, headers, 1))
                    totals[name][0] += tokens
                    totals[name][1] += spent
                    progress.advance(task)
        finally:
            proc.stop()
    return {name: tokens / spent for name, (tokens, spent) in totals.items()}


SCENARIOS = {
    # An engine-like simulator: its own latency model (time to first token, per-token time growing with the batch).
    "engine-like": {"max_num_seqs": 64},
    # No latency at all: what is measured is the gateway's own cost per request.
    "zero-latency": {"time_scale": 0, "max_num_seqs": 1024},
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def _ratio(sim: dict) -> float:
    return sim["cap_opod"].rps / max(sim["cap_direct"].rps, 1e-9)


def report(sims: list[dict], llama: dict | None, out: Path) -> str:
    import os

    lines = [
        f"# Data plane: direct vs through opod ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs)",
        "",
    ]
    lines += [
        "Load generator, opod and the engine share the same CPUs; both paths reach the same engine process. "
        "The load generator's garbage collector is paused while it measures.",
        "",
    ]
    for sim in sims:
        d, o = sim["open_direct"], sim["open_opod"]
        lines += [
            f"## Simulator, {sim['label']}: open loop, Poisson, {sim['rate']:.0f} req/s (half the slower path's capacity)",
            "",
            "| path | req/s at saturation | p50 ms | p90 ms | p99 ms | errors |",
            "|---|---|---|---|---|---|",
            f"| direct | {sim['cap_direct'].rps:.0f} | {_ms(d.pct(50))} | {_ms(d.pct(90))} | {_ms(d.pct(99))} | {d.errors} |",
            f"| through opod | {sim['cap_opod'].rps:.0f} | {_ms(o.pct(50))} | {_ms(o.pct(90))} | {_ms(o.pct(99))} | {o.errors} |",
            f"| **added by opod** | ratio {_ratio(sim):.2f} | **{_ms(o.pct(50) - d.pct(50))}** | {_ms(o.pct(90) - d.pct(90))} | "
            f"**{_ms(o.pct(99) - d.pct(99))}** | |",
            "",
        ]
    if sims:
        lines += ["Goal: p50 ≤ 1 ms and p99 ≤ 5 ms added.", ""]
    if llama:
        lines += [
            "## llama-server (SmolLM2-135M Q4_1, CPU), streamed, sequential, runs interleaved",
            "",
            "| path | tokens/s |",
            "|---|---|",
            f"| direct | {llama['direct']:.1f} |",
            f"| through opod | {llama['opod']:.1f} |",
            f"| **ratio** | **{llama['opod'] / llama['direct']:.3f}** |",
            "",
            "Goal: ratio ≥ 0.98.",
            "",
        ]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dataplane.md").write_text(text)
    _plots(sims, llama, out)
    return text


def _plots(sims: list[dict], llama: dict | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for sim in sims:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, result in (("direct", sim["open_direct"]), ("through opod", sim["open_opod"])):
            values = sorted(v * 1000 for v in result.latencies)
            if values:
                ax.plot(values, [i / len(values) for i in range(len(values))], label=name)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"Simulator ({sim['label']}), open loop at {sim['rate']:.0f} req/s")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"dataplane-sim-{sim['label']}.png", dpi=120)
        plt.close(fig)
    if llama:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(["direct", "through opod"], [llama["direct"], llama["opod"]], color=["#888", "#3a7"])
        ax.set_ylabel("tokens/s")
        ax.set_title("llama-server, SmolLM2-135M, streamed")
        fig.tight_layout()
        fig.savefig(out / "dataplane-llama-tokens.png", dpi=120)
        plt.close(fig)


def command(
    seconds: float = typer.Option(10.0, help="Seconds per measured phase."),
    concurrency: int = typer.Option(128, help="Clients in the closed loop that measures capacity."),
    runs: int = typer.Option(6, help="Streamed requests per path against llama-server."),
    max_tokens: int = typer.Option(128, help="Tokens per streamed request (ignore_eos)."),
    scenario: list[str] = typer.Option(list(SCENARIOS), help="Simulator scenarios: " + ", ".join(SCENARIOS)),
    skip_llama: bool = typer.Option(False, "--skip-llama", help="Leave out the llama-server paths."),
    skip_sim: bool = typer.Option(False, "--skip-sim", help="Leave out the simulator's scenarios."),
    results: Path = typer.Option(RESULTS, help="Where the table and plots go."),
) -> None:
    """Latency opod adds in front of the simulator, and tokens/s through opod vs direct to llama-server."""
    unknown = [s for s in scenario if s not in SCENARIOS]
    if unknown:
        raise typer.BadParameter(
            f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}", param_hint="--scenario"
        )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        sims = [] if skip_sim else [run_sim(seconds, concurrency, progress, SCENARIOS[name], name) for name in scenario]
        llama = None if skip_llama else run_llama(runs, max_tokens, progress)
    report(sims, llama, results)
    console.print(_table(sims, llama))
    console.print(f"[dim]written: {results / 'dataplane.md'} and PNG plots beside it[/]")


def _table(sims: list[dict], llama: dict | None) -> Table:
    table = Table(title="opod data plane", header_style="bold")
    for column in ("measure", "direct", "through opod", "opod adds / ratio", "goal"):
        table.add_column(column)
    for sim in sims:
        d, o, label = sim["open_direct"], sim["open_opod"], sim["label"]
        table.add_row(
            f"{label}: req/s at saturation",
            f"{sim['cap_direct'].rps:.0f}",
            f"{sim['cap_opod'].rps:.0f}",
            f"{_ratio(sim):.2f}",
            "",
        )
        for q, goal in ((50, "≤ 1 ms"), (90, ""), (99, "≤ 5 ms")):
            table.add_row(
                f"{label}: p{q} ms at {sim['rate']:.0f} req/s",
                _ms(d.pct(q)),
                _ms(o.pct(q)),
                _ms(o.pct(q) - d.pct(q)),
                goal,
            )
        table.add_row(f"{label}: errors", str(d.errors), str(o.errors), "", "0")
    if llama:
        table.add_row(
            "llama-server: tokens/s",
            f"{llama['direct']:.1f}",
            f"{llama['opod']:.1f}",
            f"{llama['opod'] / llama['direct']:.3f}",
            "≥ 0.98",
        )
    return table
