"""The compare run as one table (rich on the terminal, markdown in bench/results/<name>.md) and three plots."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from bench.compare.governance import BUDGET_MICROS
from bench.compare.runner import CompareResult, PathRun
from bench.routing import load, metrics, peers
from bench.routing.metrics import LatencySummary, StreamSummary
from bench.tables import DASH, md_table, ms, num, save_figure


def chat(p: PathRun) -> LatencySummary | None:
    return metrics.latency_summary(load.merge(p.chat)) if p.chat else None


def streamed(p: PathRun) -> StreamSummary | None:
    return metrics.stream_summary(load.merge(p.stream)) if p.stream else None


def opened(p: PathRun) -> LatencySummary | None:
    return metrics.latency_summary(load.merge(p.open)) if p.open else None


def added(run: CompareResult, p: PathRun, summary: Callable[[PathRun], object | None], attr: str) -> float:
    """The path's value minus direct's, both over the rounds they ran in turns; nan when either is missing."""
    direct = run.path("direct")
    mine, base = summary(p), summary(direct) if direct else None
    if mine is None or base is None:
        return math.nan
    return getattr(mine, attr) - getattr(base, attr)


def _added_cell(run: CompareResult, summary: Callable[[PathRun], object | None], attr: str) -> Callable[[PathRun], str]:
    def cell(p: PathRun) -> str:
        if p.key == "direct":
            own = summary(p)
            return f"{ms(getattr(own, attr))} (itself)" if own is not None else DASH
        return ms(added(run, p, summary, attr), signed=True)

    return cell


def _saturation_cell(p: PathRun) -> str:
    rps, level = p.best_saturation()
    return f"{num(rps)} (concurrency {level})" if level else DASH


def _requests_cell(p: PathRun) -> str:
    ok, failed = p.requests()
    return f"{ok:,} / {failed:,}"


def rows(run: CompareResult) -> list[tuple[str, Callable[[PathRun], str]]]:
    s = run.settings
    c = s.concurrency
    at = f"{run.offered:,.0f} req/s (½ direct saturation)" if run.offered > 0 else "½ direct saturation"
    levels = ", ".join(str(level) for level in s.zero_levels)
    return [
        (f"chat at concurrency {c}: added p50 ms", _added_cell(run, chat, "p50")),
        (f"chat at concurrency {c}: added p99 ms", _added_cell(run, chat, "p99")),
        (f"streamed chat at concurrency {c}: added TTFT p50 ms", _added_cell(run, streamed, "ttft_p50")),
        (f"streamed chat at concurrency {c}: added TTFT p99 ms", _added_cell(run, streamed, "ttft_p99")),
        (f"chat, open loop at {at}: added p50 ms", _added_cell(run, opened, "p50")),
        (f"chat, open loop at {at}: added p99 ms", _added_cell(run, opened, "p99")),
        (f"the router's CPU ms per request at {at} (its own processes)", lambda p: ms(p.cpu_per_request)),
        (f"saturation req/s, engines that answer at once (best of concurrency {levels})", _saturation_cell),
        ("requests answered / failed (every phase)", _requests_cell),
    ]


def cells(run: CompareResult) -> tuple[list[str], list[list[str]]]:
    header = ["measure", *[p.key for p in run.paths]]
    body = [
        ["what ran", *[p.label for p in run.paths]],
        ["status", *["ran" if p.ran else f"not run: {p.reason}" for p in run.paths]],
    ]
    for measure, cell in rows(run):
        body.append([measure, *[cell(p) if p.ran or p.chat else "not run" for p in run.paths]])
    return header, body


def rich_table(run: CompareResult) -> Table:
    header, body = cells(run)
    table = Table(
        title=f"opod compared: {run.settings.workers} simulator engines, {run.cores} CPU cores", header_style="bold"
    )
    for name in header:
        table.add_column(name, overflow="fold")
    for row in body:
        table.add_row(*row)
    return table


def notes(run: CompareResult) -> list[str]:
    out = [f"governance: {line}" for line in run.governance]
    opod = run.path("opod")
    if opod is not None and not math.isnan(opod.side_cpu_per_request):
        out.append(
            f"opod: its guardrail webhook's own process spent {ms(opod.side_cpu_per_request)} ms of CPU per request "
            "over the same rounds (not in opod's figure)"
        )
    for p in run.paths:
        out += [f"{p.key}: {n}" for n in p.notes]
        out += [
            f"{p.key}: {phase}: requests per engine {' / '.join(f'{n:,}' for n in counts)}"
            for phase, counts in p.spread.items()
        ]
        failed = [s for phase in [*p.chat, *p.stream, *p.open] for s in phase.samples if not s.ok and s.error]
        if failed:
            out.append(f"{p.key}: {len(failed)} requests failed, the first: {failed[0].error}")
    return out


def markdown(run: CompareResult, name: str) -> str:
    s, prof = run.settings, run.settings.profile
    header, body = cells(run)
    capacity = ", ".join(f"{num(v.rps)} req/s at concurrency {c}" for c, v in run.capacity.items()) or DASH
    lines = [
        f"# opod compared with direct, a bare Python relay and sglang-router ({run.started}; {run.cores} CPU cores, {run.machine})",
        "",
        f"`{run.command}` on commit `{run.commit}`; {run.seconds / 60:.1f} min; load average {run.load_before:.2f} "
        "as it began. Everything (the load generator, opod, the bare relay, sglang-router, the guardrail webhook and the "
        f"{s.workers} engines) shares the machine's {run.cores} cores.",
        "",
        *md_table(header, body),
        "",
        "## How it was measured",
        "",
        f"- **The fleet**: one `opod up --no-worker` leader and {s.workers} `opod join` workers, each starting one simulator "
        "engine (`bench/routing/fleet.py`); every path reaches those same engines. **direct** sends each request straight "
        "to the next engine in turn (client-side round robin, no hop), so `added` is the router's own cost.",
        "- **opod, every governance area on**, set up as an operator would with `opod ctl`: an organization, team and "
        "project and a key of that project (every opod request carries it), a price for the model, a monthly budget on the "
        f"project of {BUDGET_MICROS:,} micros (never reached), retention of request and answer bodies, and in the "
        "mounted policy the prefix routing policy and one `pre` guardrail whose webhook (`bench/webhook.py`, its own "
        "process) allows every request. One request is checked before measuring: its record shows its cost, the guardrail's "
        "verdict and a kept body.",
        "- **bare Python relay** (`bench/routing/floor.py`): uvloop and httptools, round robin over the same engines, "
        "bytes passed as they come, nothing else (no key, no routing state, no record). A yardstick: the least any "
        "Python hop costs on this machine at that moment, so opod's figures minus its figures are what opod itself does.",
        f"- **sglang-router**: `{peers.SPECS['sglang-router'].requirement}` from its own virtual environment, `--policy "
        "cache_aware`, with the same engines as workers.",
        f"- **Rounds**: {s.rounds} rounds; in each, every path in turn (the order turns by one path each round), so drift on "
        "a shared machine falls on every path alike; `added` is the path's percentile over its rounds minus direct's over "
        "the rounds beside them. Before each turn the harness waits until the path answers one request within 2 s.",
        "- **Prompts**: every phase sends short chats in turn, each opening with its own number, so no router can place "
        "one by a prefix it has seen: the table compares the routers' own overhead and load balance (prefix routing is "
        "`python -m bench routing`'s shared-prefix phase).",
        f"- **Chat at concurrency {s.concurrency}**: {s.concurrency} clients back to back, {s.seconds:g} s measured per "
        f"path and round after 0.5 s of warm-up; {s.chat_tokens} answer tokens, not streamed; latency to the last byte. "
        f"**Streamed**: the same with {s.stream_tokens} answer tokens streamed; TTFT is the time to the first text chunk.",
        f"- **Open loop**: direct's saturation on the same engines ({capacity}) halved: {num(run.offered)} req/s, Poisson "
        f"arrivals for {s.open_seconds:g} s per path and round, each request timed from when it was due.",
        "- **CPU per request**: user and system CPU of the router's own process group (opod: the leader's process; "
        "the bare relay and sglang-router: theirs) over its open-loop rounds, divided by the requests sent; the engines, the load "
        "generator and opod's guardrail webhook are not in it (the webhook's share is in the notes).",
        f"- **Saturation**: a second fleet, the same but with engines that answer at once (`time_scale` 0, "
        f"1,024 sequences at once), the governance set up again; closed loops at concurrency {', '.join(map(str, s.zero_levels))}, "
        f"{s.zero_seconds:g} s each, {s.zero_rounds} interleaved rounds; the best level's completions per second.",
        f"- **Simulator** (latency fleet): TTFT {prof.ttft_ms:g} ms + {prof.prefill_ms_per_token:g} ms per uncached prompt "
        f"token, {prof.itl_ms:g} ms per token + {prof.itl_ms_per_request:g} ms per running request, {prof.max_num_seqs} "
        "sequences at once per engine.",
        "",
        "## Notes",
        "",
        *[f"- {n}" for n in notes(run) or ["none"]],
        "",
        f"Plots: `{name}-added.png`, `{name}-open-loop-cdf.png`, `{name}-saturation.png`.",
        "",
    ]
    return "\n".join(lines)


def plots(run: CompareResult, out: Path, name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = [p for p in run.paths if p.key != "direct" and p.ran]
    measures = [
        ("chat c8 p50", chat, "p50"),
        ("chat c8 p99", chat, "p99"),
        ("stream c8 TTFT p50", streamed, "ttft_p50"),
        ("stream c8 TTFT p99", streamed, "ttft_p99"),
        ("open loop p50", opened, "p50"),
        ("open loop p99", opened, "p99"),
    ]
    written = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(routers), 1)
    for i, p in enumerate(routers):
        values = [added(run, p, summary, attr) * 1000 for _, summary, attr in measures]
        ax.bar([x + i * width for x in range(len(measures))], values, width, label=p.label)
    ax.set_xticks([x + width * (len(routers) - 1) / 2 for x in range(len(measures))])
    ax.set_xticklabels([m[0] for m in measures], fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_ylabel("ms added over direct")
    ax.set_title("latency added over direct (interleaved rounds)")
    written.append(save_figure(fig, ax, out / f"{name}-added.png", legend_size=8))

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for p in run.paths:
        values = sorted(s.latency * 1000 for phase in p.open for s in phase.samples if s.ok)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=p.label)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of answered requests")
    ax.set_title(f"chat, open loop at {num(run.offered)} req/s")
    written.append(save_figure(fig, ax, out / f"{name}-open-loop-cdf.png", legend_size=8))

    fig, ax = plt.subplots(figsize=(6.5, 4))
    ran = [p for p in run.paths if p.saturation]
    ax.bar([p.key for p in ran], [p.best_saturation()[0] for p in ran], color=["#888", "#3a7", "#37a"][: len(ran)])
    ax.set_ylabel("requests/s")
    ax.set_title("saturation, engines that answer at once")
    written.append(save_figure(fig, ax, out / f"{name}-saturation.png", legend_size=8))
    return written


def write(run: CompareResult, out: Path, name: str = "compare") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    path.write_text(markdown(run, name))
    plots(run, out, name)
    return path
