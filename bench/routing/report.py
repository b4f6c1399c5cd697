"""The run's results as one table (rich on the terminal, markdown in bench/results/routing.md) and three plots."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from bench.routing import decision, peers, runner
from bench.routing import goals as goals_mod
from bench.routing.runner import PathResult, RunResult
from bench.tables import DASH, md_table, ms, num, percent, save_figure


def _s(seconds: float) -> str:
    return DASH if seconds is None or math.isnan(seconds) else f"{seconds:.3f}"


Cell = Callable[[PathResult], str]


def _open_cell(p: PathResult, rate: float) -> str:
    if rate in p.overloaded:
        return f"not run: over {p.overloaded[rate]:,.0f} req/s capacity"
    if rate not in p.open:
        return DASH
    s = p.open[rate]
    return f"{ms(s.p50)} / {ms(s.p99)}; {s.errors}"


def _rows(run: RunResult) -> list[tuple[str, Cell, str]]:
    """(measure, cell for one path, goal key) for every row of the main table."""
    rate = goals_mod.half_load(run)
    direct = run.path("direct")
    oracle = run.oracle.hit_rate
    slo = run.settings.ttft_slo
    levels = run.settings.concurrency

    def added_cell(q: int) -> Cell:
        def cell(p: PathResult) -> str:
            if p.key == "direct":
                return f"{ms(getattr(p.open[rate], f'p{q}'))} (itself)" if rate in p.open else DASH
            if rate in p.overloaded:
                return f"overloaded (capacity {p.overloaded[rate]:,.0f} req/s)"
            return ms(goals_mod.added(run, p, rate, q), signed=True)

        return cell

    def own_cell(p: PathResult) -> str:
        s = p.open.get(rate)
        if s is None or math.isnan(s.own_p50):
            return DASH
        return f"{ms(s.own_p50)} / {ms(s.own_p99)}"

    def stream_added(attr: str) -> Cell:
        def cell(p: PathResult) -> str:
            if p.stream is None:
                return DASH
            value = getattr(p.stream, attr)
            if p.key == "direct":
                return f"{ms(value)} (itself)"
            base = getattr(direct.stream, attr) if direct and direct.stream else math.nan
            return ms(value - base, signed=True)

        return cell

    def prefix(fn: Callable[[PathResult], str]) -> Cell:
        return lambda p: DASH if p.prefix is None else fn(p)

    def errors_w1(p: PathResult) -> str:
        if not p.sweep and not p.open:
            return DASH
        return str(sum(s.errors for s in p.sweep.values()) + sum(s.errors for s in p.open.values()))

    def decision_cell(p: PathResult) -> str:
        slowest = max((d for d in run.decisions if d.judged), key=lambda d: d.p99, default=None)
        if p.key != "opod" or slowest is None:
            return DASH
        return f"{slowest.p50 * 1e6:.0f} / {slowest.p99 * 1e6:.0f} ({slowest.scenario})"

    half = f"{rate:,.0f} req/s (½ direct capacity)" if rate else "½ direct capacity"
    return [
        (
            f"routing decision p50 / p99 µs, {decision.WORKERS} workers, in process (slowest judged scenario)",
            decision_cell,
            "routing decision",
        ),
        (
            f"1 short chat: req/s at saturation (best of concurrency {levels[0]}…{levels[-1]})",
            lambda p: num(p.saturation),
            "saturation",
        ),
        (f"1 short chat: added p50 ms at {half}", added_cell(50), "added p50"),
        (f"1 short chat: added p99 ms at {half}", added_cell(99), "added p99"),
        (f"1 short chat: the router's own time p50 / p99 ms at {half} (its Server-Timing)", own_cell, ""),
        (
            f"1 short chat: the router's CPU ms per request at {half} (its processes)",
            lambda p: ms(p.cpu_per_request),
            "",
        ),
        ("1 short chat: errors (closed + open loop)", errors_w1, ""),
        ("2 streamed: TTFT p50 ms added", stream_added("ttft_p50"), ""),
        ("2 streamed: TTFT p99 ms added", stream_added("ttft_p99"), ""),
        ("2 streamed: inter-token p50 ms added", stream_added("itl_p50"), ""),
        ("2 streamed: errors", lambda p: DASH if p.stream is None else str(p.stream.errors), ""),
        ("3 shared prefix: TTFT p50 s", prefix(lambda p: _s(p.prefix.ttft_p50)), ""),
        ("3 shared prefix: TTFT p90 s", prefix(lambda p: _s(p.prefix.ttft_p90)), "prefix TTFT p90"),
        ("3 shared prefix: output tokens/s", prefix(lambda p: num(p.prefix.output_tps)), "prefix output tok/s"),
        (
            f"3 shared prefix: cache-hit rate (oracle {oracle:.1%})",
            prefix(
                lambda p: (
                    f"{percent(p.prefix_hit_rate)} ({percent(p.prefix_hit_rate / oracle if oracle else math.nan)} of oracle)"
                )
            ),
            "prefix cache hits",
        ),
        (f"3 shared prefix: goodput req/s (TTFT ≤ {slo:g} s)", prefix(lambda p: num(p.prefix.goodput, 1)), ""),
        (
            "3 shared prefix: error rate",
            prefix(lambda p: f"{percent(p.prefix.error_rate)} ({p.prefix.errors}/{p.prefix.sent})"),
            "prefix error rate",
        ),
    ]


def _cells(run: RunResult) -> tuple[list[str], list[list[str]]]:
    goals = {g.row: g for g in goals_mod.check(run)}
    header = ["measure", *[p.key for p in run.paths], "goal (opod)"]
    # The first rows say what each column is and whether it ran, so a peer that could not is reported with its reason.
    body = [
        ["what ran", *[p.label for p in run.paths], ""],
        ["status", *["ran" if p.ran else f"not run: {p.reason}" for p in run.paths], ""],
    ]
    for measure, cell, goal_key in _rows(run):
        row = [measure]
        for path in run.paths:
            if not path.ran:
                row.append("not run")
                continue
            try:
                row.append(cell(path))
            except (KeyError, AttributeError, TypeError, ZeroDivisionError):
                row.append(DASH)
        goal = goals.get(goal_key)
        row.append(f"{goal.target}: {goal.verdict}" if goal else "")
        body.append(row)
    return header, body


def rich_table(run: RunResult) -> Table:
    header, body = _cells(run)
    table = Table(
        title=f"Routing: {run.settings.workers} simulator workers, {run.cores} CPU cores",
        header_style="bold",
        show_lines=False,
    )
    for name in header:
        table.add_column(name, overflow="fold")
    for row in body:
        table.add_row(
            *[
                f"[{'green' if c.endswith(': met') else 'red' if c.endswith(': missed') else 'white'}]{c}[/]"
                if i == len(row) - 1 and c
                else c
                for i, c in enumerate(row)
            ]
        )
    return table


def markdown(run: RunResult) -> str:
    s = run.settings
    shape, prof = s.prefix, s.profile
    header, body = _cells(run)
    lines = [
        f"# Routing benchmark ({run.started}; {run.cores} CPU cores, {run.machine}; {'quick' if s.quick else 'full'} run, {run.seconds / 60:.1f} min, seed {s.seed})",
        "",
        f"One run, side by side, on loopback, against the same {s.workers} simulator engines (each started by an `opod join` worker). "
        "Paths run one after another; every engine's prefix cache is emptied before each phase. The load generator, opod, the "
        f"peers and the {s.workers} engines share the machine's {run.cores} cores, so the engines' latency model (not the CPUs) "
        "is meant to set the answer times; the load generator's garbage collector is paused while it measures, and the simulators "
        "freeze their start-up objects, so neither stalls requests in whichever window a collection falls. Columns are the paths; `added` is the path's value minus the direct path's (at the latency goals' load, minus direct measured in turns with the path).",
        "",
        *md_table(header, body),
        "",
        "## Paths",
        "",
        "| path | what ran | status |",
        "|---|---|---|",
    ]
    for p in run.paths:
        status = "ran" if p.ran else f"**not run**: {p.reason}"
        if p.notes:
            status += "; " + "; ".join(p.notes)
        lines.append(f"| {p.key} | {p.label} | {status.replace('|', '/')} |")
    installs = ", ".join(f"{spec.requirement} ({spec.first_install})" for spec in peers.SPECS.values())
    lines += [
        "",
        f"Peers run from their own virtual environments under `{s.peers_dir}`, installed on first use: {installs}.",
        "",
        "## 1. Short chat: saturation (closed loop, req/s; p50 ms in brackets)",
        "",
        *md_table(
            ["concurrency", *[p.key for p in run.paths if p.ran]],
            [
                [
                    str(c),
                    *[
                        f"{num(p.sweep[c].rps)} ({ms(p.sweep[c].p50)})" if c in p.sweep else DASH
                        for p in run.paths
                        if p.ran
                    ],
                ]
                for c in s.concurrency
            ],
        ),
        "",
        "## 1. Short chat: open loop, Poisson arrivals (p50 / p99 ms; errors)",
        "",
        *md_table(
            ["offered req/s", *[p.key for p in run.paths if p.ran]],
            [[f"{rate:,.0f}", *[_open_cell(p, rate) for p in run.paths if p.ran]] for rate in run.offered],
        ),
        "",
        f"## Routing decision (opod's router in process, {decision.WORKERS} workers; µs per decision)",
        "",
        *md_table(
            ["scenario", "p50 µs", "p99 µs", "decisions", "goal"],
            [
                [
                    d.scenario,
                    f"{d.p50 * 1e6:.1f}",
                    f"{d.p99 * 1e6:.1f}",
                    f"{d.samples:,}",
                    "judged" if d.judged else "not judged: a state prefix routing keeps a fleet out of",
                ]
                for d in run.decisions
            ]
            or [["not measured: the opod path did not run", DASH, DASH, DASH, DASH]],
        ),
        "",
        "## How it was measured",
        "",
        f"- **Routing decision**: `opod.fleet.router.Router.pick` timed one call at a time (`bench/routing/decision.py`), before the "
        f"fleet starts, with {decision.WORKERS} workers registered and heartbeating through the leader's own calls, the bench's "
        f"prefix policy and the leader's collector setting; the prompt is {decision.PROMPT_BLOCKS} blocks of "
        f"{decision.BLOCK_SIZE} tokens. The request's block hashes are made before the decision and are not in it. "
        "The scenarios are described in that module; a p99 there includes whatever the machine itself interrupts a "
        "decision with (on a shared VM, a few percent of decisions of tens of µs each).",
        f"- **Simulator** (`opod sim`, vLLM dialect, through `OPOD_ENGINE_FLAGS`): block size {prof.block_size}, {prof.kv_blocks} KV blocks "
        f"per engine, {prof.max_num_seqs} sequences at once, TTFT {prof.ttft_ms:g} ms + {prof.prefill_ms_per_token:g} ms per uncached "
        f"prompt token, {prof.itl_ms:g} ms per token + {prof.itl_ms_per_request:g} ms per running request.",
        f"- **vllm-router kv_aware** subscribes (`--kv-event-source`) to every engine's KV events on a second endpoint the "
        "engine's PUB socket binds (plan flag `kv_events_bind`, one port per worker), the very events opod's worker hears, with "
        f"`--kv-event-block-size {prof.block_size}` and `--kv-event-model`; it tokenizes through each engine's "
        "`POST /v1/chat/completions/render`. Whether it credited a cached prefix is read from its own "
        "`vllm_router_kv_placement_lookups_total` over the shared-prefix phase (the path's notes). **vllm-router cache_aware** "
        "is the same router with its text-based radix tree.",
        "- **Direct** sends each request straight to the next engine in turn (client-side round robin, no hop), so every path "
        "loads each engine alike and `added` is the router's own cost rather than a batch-size difference. It runs no workload 3: "
        "with no router there is no placement to judge (`opod-rr` is the round-robin baseline).",
        "- **relay-floor** is a yardstick, not a router: a bare Python relay (uvloop and httptools, round robin, kept "
        "connections; no key check, routing state or accounting; `bench/routing/floor.py`). Its `added` is what one Python "
        "hop costs on this machine during the run; read opod's beside it (each carries the machine's noise). "
        "It runs no workload 3 either.",
        f"- **1 short chat**: 8 answer tokens, not streamed; closed loop {s.closed_seconds:g} s per concurrency level; open loop "
        f"{s.open_seconds:g} s per offered load, at {', '.join(f'{f:.0%}' for f in s.loads)} of the direct path's capacity; a load "
        "above 1.5× a path's own saturation rate is not run for it (marked overloaded). Before each phase the harness waits until "
        "the path answers a request within 2 s (an overloaded proxy drains its backlog, a router closes its circuit breakers) "
        "and empties the engines' prefix caches. At the load nearest half the direct capacity (the latency goals' load) each "
        f"path runs {runner.PAIRED_ROUNDS} times in turns with direct, and its `added` rows compare the two: a shared machine's "
        "speed drifts over a run, and a path measured many minutes after the direct column would be charged the drift. "
        "The router's own time is what opod's `Server-Timing` header says it spent per request (reading, routing, recording), "
        "without the engine's time and without the extra hops on either side of it; the peers send no such header. "
        "The router's CPU per request is the user and system time of its process group (its process and those it started; from /proc) over its runs "
        "at that load, divided by the requests sent; the engines and the load generator are not in it.",
        f"- **2 streamed chat**: {s.stream_tokens} answer tokens, Poisson at {s.stream_rate:g} req/s for {s.stream_seconds:g} s; "
        "TTFT = due time to first text chunk; inter-token = gap between text chunks.",
        f"- **3 shared prefix** (llm-d's capacity benchmark, scaled down): {shape.groups} system prompts of {shape.system_tokens} tokens, "
        f"sessions of {shape.turns} turns starting at Poisson arrivals for {shape.seconds:g} s ({shape.rate:g} req/s offered: "
        "the default 96 is about twice what round robin carries on the default fleet, the kind of load at which llm-d compares "
        "routers; below round robin's capacity every placement delivers the offered tokens and only TTFT tells them apart; "
        f"{run.prefix_requests} requests), each turn re-sending the conversation plus a {shape.question_tokens}-token question, "
        f"history answers of {shape.history_tokens} tokens, {shape.output_tokens} answer tokens, streamed; a turn follows the previous "
        f"one after {shape.think_s:g} s on average. Output tokens/s and goodput divide by first send to last answer; requests not "
        f"answered {s.drain:g} s after the last send count as errors.",
        f"- **Cache-hit rate**: the engines' own counters (`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`) over the phase. "
        f"**Oracle**: the trace replayed through one LRU cache as large as all engines' caches together ({run.oracle.capacity_blocks} "
        f"blocks), with the simulator's rules: {run.oracle.hit_rate:.1%}.",
        "",
        "Plots: `routing-saturation.png`, `routing-added-latency.png`, `routing-ttft-cdf.png`.",
        "",
    ]
    return "\n".join(lines)


def plots(run: RunResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [p for p in run.paths if p.ran]
    written = []

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for p in ran:
        levels = sorted(p.sweep)
        if levels:
            ax.plot(levels, [p.sweep[c].rps for c in levels], marker="o", label=p.label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("requests/s")
    ax.set_title(f"1 short chat: saturation ({run.cores} cores shared)")
    written.append(save_figure(fig, ax, out / "routing-saturation.png", legend_size=7))

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    lowest = 0.0
    for p in ran:
        if p.key == "direct":
            continue
        rates = [r for r in run.offered if r in p.open]
        if rates:
            p50 = [goals_mod.added(run, p, r, 50) * 1000 for r in rates]
            p99 = [goals_mod.added(run, p, r, 99) * 1000 for r in rates]
            lowest = min([lowest, *[v for v in p50 + p99 if not math.isnan(v)]])
            (line,) = ax.plot(rates, p50, marker="o", label=f"{p.label} p50")
            ax.plot(rates, p99, marker="x", linestyle="--", color=line.get_color(), label=f"{p.label} p99")
    ax.axhline(1, color="grey", linewidth=0.8, linestyle=":")
    ax.axhline(5, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(
        bottom=lowest * 1.5 if lowest < 0 else 0
    )  # no empty negative half when nothing came out faster than direct
    ax.set_xlabel("offered load (req/s, Poisson)")
    ax.set_ylabel("latency added over direct (ms)")
    ax.set_title("1 short chat: added latency by offered load (goals: p50 ≤ 1 ms, p99 ≤ 5 ms)")
    written.append(save_figure(fig, ax, out / "routing-added-latency.png", legend_size=6))

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for p in ran:
        if p.prefix_ttfts:
            values = p.prefix_ttfts
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=p.label)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of answered requests")
    ax.set_title(f"3 shared prefix: TTFT CDF ({run.prefix_requests} requests)")
    written.append(save_figure(fig, ax, out / "routing-ttft-cdf.png", legend_size=7))
    return written


def write(run: RunResult, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "routing.md"
    path.write_text(markdown(run))
    plots(run, out)
    return path
