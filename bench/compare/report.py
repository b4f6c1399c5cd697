"""The compare run as one table (rich on the terminal, markdown in bench/results/<name>.md) and three plots."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from bench.compare.governance import BUDGET_MICROS, WEBHOOK_RULE
from bench.compare.runner import CompareResult, PathRun
from bench.guard import GUARD_POLICY
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
        (
            f"the router's wait for a core, ms per request at {at} (its threads ready to run, not running)",
            lambda p: ms(p.wait_per_request),
        ),
        (f"saturation req/s, engines that answer at once (best of concurrency {levels})", _saturation_cell),
        (
            "the router's CPU ms per request at saturation (its own processes, at the best concurrency)",
            lambda p: ms(p.saturation_cpu_per_request),
        ),
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
    out = list(run.governance)
    hooked = run.path("opod-webhook")
    if hooked is not None and not math.isnan(hooked.side_cpu_per_request):
        out.append(
            f"opod-webhook: its guardrail webhook's own process spent {ms(hooked.side_cpu_per_request)} ms of CPU per "
            "request over the same rounds (not in opod-webhook's figure)"
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


def _said(parts: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def _title(run: CompareResult) -> str:
    keys = {p.key for p in run.paths}
    others = ["direct"]
    others += ["opod with a policy-file guardrail webhook"] if {"opod", "opod-webhook"} <= keys else []
    others += ["a bare Python relay"] if "relay-floor" in keys else []
    others += ["a governed Python relay"] if "governed-floor" in keys else []
    others += ["sglang-router"] if "sglang-router" in keys else []
    who = "opod" if "opod" in keys else "opod with a policy-file guardrail webhook"
    return f"{who} compared with {_said(others)}"


def _everything(run: CompareResult) -> str:
    """What shares the machine, as the report's opening says it."""
    keys = {p.key for p in run.paths}
    parts = ["the load generator"]
    parts += ["opod"] if keys & {"opod", "opod-webhook"} else []
    parts += ["the bare relay"] if "relay-floor" in keys else []
    parts += ["the governed relay"] if "governed-floor" in keys else []
    parts += ["sglang-router"] if "sglang-router" in keys else []
    parts += ["opod-webhook's guardrail webhook"] if "opod-webhook" in keys else []
    return _said([*parts, f"the {run.settings.workers} engines"])


def _peers(run: CompareResult) -> list[str]:
    """The bullets of How it was measured for the other routers that were asked for."""
    keys = {p.key for p in run.paths}
    lines = []
    if "relay-floor" in keys:
        lines.append(
            "- **bare Python relay** (`bench/routing/floor.py`): uvloop and httptools, round robin over the same "
            "engines, bytes passed as they come, nothing else (no key, no routing state, no record). A yardstick: the "
            "least any Python hop costs on this machine at that moment, so opod's figures minus its figures are what "
            "opod itself does."
        )
    if "governed-floor" in keys:
        lines.append(
            "- **governed Python relay** (`bench/routing/governed_floor.py`): the bare relay plus the least work each "
            "governance area of opod's path needs, written as protocol callbacks (no task, future or framework): the "
            "key by its SHA-256, the body parsed and checked, the guard policy's expressions on the request and a whole "
            "answer, a price and a budget reserved and settled, an admission count, the engine with the fewest "
            "requests in flight, a journal line at the send and at the end, and the usage row and both bodies "
            "committed to SQLite by a thread every 0.2 s. A yardstick: what governance costs one Python hop at the "
            "least, so opod's figures minus its figures are what opod's own structure adds."
        )
    if "sglang-router" in keys:
        lines.append(
            f"- **sglang-router**: `{peers.SPECS['sglang-router'].requirement}` from its own virtual environment, "
            "`--policy cache_aware`, with the same engines as workers."
        )
    return lines


def _governed(run: CompareResult) -> list[str]:
    """The governed paths' bullets of How it was measured: what each turned on, and how its guardrail ran."""
    keys = {p.key for p in run.paths}
    areas = (
        "set up as an operator would with `opod ctl`: an organization, team and project and a key of that project "
        "(every request of the path carries it), and in the cluster settings a price for the model, a monthly budget "
        f"on the project of {BUDGET_MICROS:,} micros (never reached) and retention of request and answer bodies"
    )
    lines = []
    if "opod" in keys:
        lines.append(
            f"- **opod, every governance area on**, {areas}; its guardrail is the settings' guard policy "
            f"`{GUARD_POLICY}`, which every request gets by `default` and the leader runs itself, no call leaving it: "
            "emails redacted in the request and in a whole answer, card numbers and a prompt-injection pattern blocked "
            "in the request (`bench/compare/governance.py`; `docs/settings.md`, Guard). The mounted policy holds the "
            "prefix routing policy and no guardrail webhook. One request is checked before measuring: its record shows "
            f"its cost, `guard_action` allow by `guard_policy` `{GUARD_POLICY}`, and a kept body."
        )
    if "opod-webhook" in keys:
        same = "the same governance as opod" if "opod" in keys else f"every governance area on, {areas}"
        lines.append(
            f"- **opod-webhook** (`--path opod-webhook`; not run by default), {same}, but no guard "
            f"policy: its guardrail is one `pre` guardrail `{WEBHOOK_RULE}` in the mounted policy (beside the prefix "
            "routing policy) whose webhook (`bench/webhook.py`, a process of its own) allows every request: one more "
            "HTTP exchange per request. One request is checked before measuring: its record shows its cost, "
            f"`guard_action` allow by `{WEBHOOK_RULE}` (so no guard policy ran), and a kept body."
        )
    if {"opod", "opod-webhook"} <= keys:
        lines.append(
            "- **opod and opod-webhook share the fleet's leader**, and each guardrail applies to every request of it, "
            "so each of their turns begins by putting the path's own guardrail in force and the other's out (a new "
            "settings version, in force on the leader at once, and a new policy file, waited for until the leader "
            "applied it), before the turn's readiness check and outside the measured time."
        )
    return lines


def markdown(run: CompareResult, name: str) -> str:
    s, prof = run.settings, run.settings.profile
    header, body = cells(run)
    capacity = ", ".join(f"{num(v.rps)} req/s at concurrency {c}" for c, v in run.capacity.items()) or DASH
    side = ["opod-webhook's guardrail webhook"] if run.path("opod-webhook") is not None else []
    lines = [
        f"# {_title(run)} ({run.started}; {run.cores} CPU cores, {run.machine})",
        "",
        f"`{run.command}` on commit `{run.commit}`; {run.seconds / 60:.1f} min; load average {run.load_before:.2f} "
        f"as it began. Everything ({_everything(run)}) shares the machine's {run.cores} cores.",
        "",
        *md_table(header, body),
        "",
        "## How it was measured",
        "",
        f"- **The fleet**: one `opod up --no-worker` leader and {s.workers} `opod join` workers, each starting one simulator "
        "engine (`bench/routing/fleet.py`); every path reaches those same engines. **direct** sends each request straight "
        "to the next engine in turn (client-side round robin, no hop), so `added` is the router's own cost.",
        *_governed(run),
        *_peers(run),
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
        "- **CPU per request**: user and system CPU of the router's own process group (opod's paths: the leader's "
        "process; any other router: its own) over its open-loop rounds, divided by the requests sent; "
        f"{_said(['the engines', 'the load generator', *side])} are not in it"
        + (" (the webhook's share is in the notes)." if side else "."),
        "- **Wait for a core**: over the same rounds, the time the threads of the same processes were ready to run "
        "but waited for a core (the kernel's run-queue delay, `/proc/PID/task/TID/schedstat`), divided by the "
        "requests sent: on a machine whose cores the router shares with the engines and the load generator, part of "
        "what it adds to a request's latency besides its own CPU. Summed over threads, so a router with several "
        "threads waits on several at once.",
        f"- **Saturation**: a second fleet, the same but with engines that answer at once (`time_scale` 0, "
        f"1,024 sequences at once), the governance set up again; closed loops at concurrency {', '.join(map(str, s.zero_levels))}, "
        f"{s.zero_seconds:g} s each, {s.zero_rounds} interleaved rounds; the best level's completions per second, "
        "and the router's CPU per request answered over that level's measured windows (the same processes as above): "
        "with every core busy, the machine's cores over what each process spends per request set how far a path goes.",
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
    colors = {
        "direct": "#888",
        "opod": "#3a7",
        "opod-webhook": "#7c5",
        "relay-floor": "#a73",
        "governed-floor": "#c85",
        "sglang-router": "#37a",
    }
    ax.bar([p.key for p in ran], [p.best_saturation()[0] for p in ran], color=[colors[p.key] for p in ran])
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
