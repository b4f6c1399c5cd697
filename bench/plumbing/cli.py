"""``python -m bench plumbing``: opod's HTTP server and engine client against bare Python ones, CPU per request.

Four servers, each in a process of its own (``bench.plumbing.servers``), on the same loopback and the
same open-loop load (Poisson arrivals at ``--rate``, the bench's chats, a key in each request's header):

- **bare answer** and **opod answer** answer every request themselves with one fixed chat completion:
  their difference is what opod's server (uvicorn's protocol with opod's short way, a task per request,
  the request and answer objects) costs a request over a bare protocol;
- **bare relay** (``bench/routing/floor.py``) and **opod relay** pass each request to an engine (the bare
  answering server in a process of its own) and its answer back: their difference adds what opod's engine
  client costs.

None of them checks a key, routes or records anything: that is ``python -m bench stages``. Rounds measure
every server in turn (the order turned each round); CPU is each server process's, every thread, from
schedstat, per request answered; the table gives medians of the rounds.

A second table sets the two answering protocols side by side in this process, warm and with the CPU's
caches emptied before each request (``bench.plumbing.in_process``): what the gap under load is made of.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer

from bench import loadgen
from bench.plumbing import in_process
from bench.ports import free_port
from bench.procs import checkout_commit
from bench.stages.ab import RESULTS, console, cpu_ns
from bench.stages.measure import PAYLOADS

REPO = Path(__file__).resolve().parents[2]
HEADERS = {"Authorization": "Bearer sk-plumbing", "Content-Type": "application/json"}
PATHS = {
    "bare answer": "a bare httptools protocol that answers each request itself",
    "opod answer": "opod's HTTP server (opod.http.serving, the short way) whose handler answers each request itself",
    "bare relay": "a bare httptools relay to the engine (bench/routing/floor.py)",
    "opod relay": "opod's HTTP server whose handler relays to the engine through opod.http.upstream",
}


@dataclass
class Measured:
    cpu_us: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0


def _start(args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{shlex.join(args)} did not start: {line}{proc.stdout.read()[-2000:]}")
    return proc


def _round(urls: dict[str, str], pids: dict[str, int], rate: float, seconds: float, n: int, out: dict) -> None:
    names = list(urls)
    turn = n % len(names)
    for name in names[turn:] + names[:turn]:
        before = cpu_ns(pids[name])[0]
        got = asyncio.run(loadgen.open_loop(urls[name], PAYLOADS, HEADERS, rate, seconds, n))
        spent = cpu_ns(pids[name])[0] - before
        side = out[name]
        side.requests += len(got.latencies)
        side.errors += got.errors
        side.cpu_us.append(spent / max(len(got.latencies), 1) / 1000)
        side.p50_ms.append(got.pct(50) * 1000)
        side.p99_ms.append(got.pct(99) * 1000)


def report(
    out: dict[str, Measured], rate: float, seconds: float, rounds: int, alone: list[in_process.InProcess], cold: int
) -> str:
    med = statistics.median
    cpu = {name: med(side.cpu_us) for name, side in out.items()}
    lines = [
        f"# What opod's HTTP plumbing costs a request ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `python -m bench {shlex.join(sys.argv[1:])}`",
        "",
        f"Commit `{checkout_commit(REPO)}`; {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{os.getloadavg()[0]:.2f} at the end. Open loop at {rate:g} req/s, {rounds} rounds of {seconds:g} s per "
        "server, every server in turn (the order turned each round); CPU is the server process's (every thread, "
        "schedstat) per request answered, the median of the rounds. The engine the relays call is the bare "
        "answering server, in a process of its own. Nothing checks a key, routes or records: "
        "`python -m bench stages` measures that.",
        "",
        "| server | what it is | requests | errors | CPU µs/req (median) | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, side in out.items():
        lines.append(
            f"| {name} | {PATHS[name]} | {side.requests} | {side.errors} | {cpu[name]:.0f} | "
            f"{med(side.p50_ms):.2f} | {med(side.p99_ms):.2f} |"
        )
    server = cpu["opod answer"] - cpu["bare answer"]
    relay = cpu["opod relay"] - cpu["bare relay"]
    lines += [
        "",
        f"- opod's server costs a request **{server:+.0f} µs** of CPU over the bare protocol (opod answer minus bare "
        "answer): uvicorn's protocol and opod's short way, the task each request runs in, the request and "
        "answer objects.",
        f"- opod's server and engine client cost **{relay:+.0f} µs** over the bare relay (opod relay minus bare "
        f"relay), of which the engine client's share is about {relay - server:+.0f} µs.",
        "",
        *in_process.report(alone, cold, server, relay - server),
    ]
    return "\n".join(lines)


def command(
    rate: float = typer.Option(427.0, help="Requests per second, open loop, for each server in each round."),
    seconds: float = typer.Option(2.0, help="Seconds per server and round."),
    rounds: int = typer.Option(8, min=1, help="Rounds; each measures every server in turn."),
    warm: float = typer.Option(1.0, help="Seconds of requests warming each server first."),
    results_dir: Path = typer.Option(RESULTS, "--results-dir", help="Where the table goes."),
    name: str = typer.Option("plumbing", help="The table's file name, <name>.md."),
    warm_requests: int = typer.Option(3000, min=1, help="Requests per protocol in process, back to back (warm)."),
    cold_requests: int = typer.Option(300, min=1, help="Requests per protocol in process, caches emptied before each."),
) -> None:
    """opod's HTTP server and engine client against bare Python ones: CPU per request on the same load."""
    procs: list[subprocess.Popen[str]] = []
    try:
        with console.status("starting the engine and the four servers"):
            ports = {name: free_port() for name in ("engine", *PATHS)}
            engine = f"http://127.0.0.1:{ports['engine']}"
            procs.append(_start(["-m", "bench.plumbing.servers", "bare-answer", str(ports["engine"])]))
            started = {
                "bare answer": ["-m", "bench.plumbing.servers", "bare-answer", str(ports["bare answer"])],
                "opod answer": ["-m", "bench.plumbing.servers", "opod-answer", str(ports["opod answer"])],
                "bare relay": ["bench/routing/floor.py", str(ports["bare relay"]), engine],
                "opod relay": ["-m", "bench.plumbing.servers", "opod-relay", str(ports["opod relay"]), engine],
            }
            pids = {}
            for path, args in started.items():
                proc = _start(args)
                procs.append(proc)
                pids[path] = proc.pid
        urls = {path: f"http://127.0.0.1:{ports[path]}/v1/chat/completions" for path in PATHS}
        for url in urls.values():
            asyncio.run(loadgen.open_loop(url, PAYLOADS, HEADERS, rate, warm, 99))
        out = {path: Measured() for path in PATHS}
        for n in range(rounds):
            _round(urls, pids, rate, seconds, n, out)
            now = ", ".join(f"{path} {side.cpu_us[-1]:.0f}" for path, side in out.items())
            console.print(f"round {n + 1}/{rounds}: CPU µs/req {now}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    with console.status("the two answering protocols in this process, warm and cold"):
        alone = in_process.measure(warm_requests, cold_requests)
    text = report(out, rate, seconds, rounds, alone, cold_requests)
    results_dir.mkdir(parents=True, exist_ok=True)
    target = results_dir / f"{name}.md"
    target.write_text(text)
    console.print(text)
    console.print(f"[dim]written: {target}[/]")
