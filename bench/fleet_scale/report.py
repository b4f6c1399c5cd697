"""The run as one table (rich on the terminal, markdown in bench/results/fleet-scale.md) and one plot of growth with N."""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.table import Table

from bench.fleet_scale.planner import PlannerResult
from bench.fleet_scale.runner import Settings, SizeResult

DASH = "—"
GOAL_CPU = 25.0
GOAL_PASS = 1.0
GOAL_P99 = 0.050


@dataclass
class Run:
    sizes: list[SizeResult]
    planner: dict[int, PlannerResult]
    settings: Settings
    seconds: float
    quick: bool
    load: float = math.nan
    """The machine's 1-minute load average as the run began (its cores may be shared)."""


def _f(value: float, digits: int = 1, scale: float = 1.0) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value * scale:.{digits}f}"


def _ms_pair(latency) -> str:
    if latency is None:
        return DASH
    return f"{_f(latency.p50, 1, 1000)} / {_f(latency.p99, 1, 1000)}"


COLUMNS = (
    "nodes",
    "heartbeat CPU % of a core",
    "pass s (planning s)",
    "planner s in-process",
    "summary p50 / p99 ms",
    "nodes p50 / p99 ms",
    "CPU % with the replicas",
    "register s",
    "add models s",
)


def rows(run: Run) -> list[list[str]]:
    out = []
    for s in run.sizes:
        planner = run.planner.get(s.nodes)
        out.append(
            [
                f"{s.nodes:,}",
                _f(s.cpu),
                f"{_f(s.pass_seconds, 2)} ({_f(s.plan_seconds, 2)})",
                _f(planner.seconds, 3) if planner else DASH,
                _ms_pair(s.summary),
                _ms_pair(s.nodes_view),
                _f(s.cpu_after),
                _f(s.register_seconds),
                _f(s.post_seconds),
            ]
        )
    return out


def goals(run: Run) -> list[str]:
    """The issue's goals, judged at the largest fleet measured."""
    if not run.sizes:
        return []
    s = run.sizes[-1]
    planner = run.planner.get(s.nodes)

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = [
        f"heartbeats ≤ {GOAL_CPU:g} % of one core: {_f(s.cpu)} % — {verdict(s.cpu <= GOAL_CPU)}",
        f"a pass placing {run.settings.models} models ≤ {GOAL_PASS:g} s: {_f(s.pass_seconds, 2)} s with the load calls, "
        f"{_f(s.plan_seconds, 2)} s to its first load call, {_f(planner.seconds if planner else math.nan, 3)} s of Planner work — "
        f"{verdict(s.pass_seconds <= GOAL_PASS)} (whole pass), {verdict(s.plan_seconds <= GOAL_PASS)} (placement)",
    ]
    for name, latency in (("summary", s.summary), ("nodes", s.nodes_view)):
        p99 = latency.p99 if latency else math.nan
        lines.append(
            f"`GET /api/v1/{name}` p99 ≤ {GOAL_P99 * 1000:g} ms: {_f(p99, 1, 1000)} ms — {verdict(p99 <= GOAL_P99)}"
        )
    return [f"at {s.nodes:,} nodes, " + line for line in lines]


def growth(run: Run) -> str:
    """How each figure grows from the smallest fleet to the largest, as a ratio."""
    if len(run.sizes) < 2:
        return ""
    a, b = run.sizes[0], run.sizes[-1]
    pa, pb = run.planner.get(a.nodes), run.planner.get(b.nodes)

    def ratio(x: float, y: float) -> str:
        return f"×{y / x:.1f}" if x and math.isfinite(x) and math.isfinite(y) else DASH

    parts = [
        f"heartbeat CPU {ratio(a.cpu, b.cpu)}",
        f"pass {ratio(a.pass_seconds, b.pass_seconds)}",
        f"planner {ratio(pa.seconds, pb.seconds)}" if pa and pb else "",
        f"summary p99 {ratio(a.summary.p99, b.summary.p99)}" if a.summary and b.summary else "",
        f"nodes p99 {ratio(a.nodes_view.p99, b.nodes_view.p99)} (answer {a.nodes_bytes / 1e6:.1f} → {b.nodes_bytes / 1e6:.1f} MB)"
        if a.nodes_view and b.nodes_view
        else "",
    ]
    return f"From {a.nodes:,} to {b.nodes:,} nodes (×{b.nodes / a.nodes:g}): " + ", ".join(p for p in parts if p) + "."


def rich_table(run: Run) -> Table:
    table = Table(title="fleet scale: one leader, simulated nodes of 8 GPUs heartbeating")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in rows(run):
        table.add_row(*row)
    return table


def markdown(run: Run) -> str:
    s = run.settings
    lines = [
        "# Fleet scale: the management API and the reconciler with 100 to 1,000 nodes",
        "",
        f"Run {datetime.now():%Y-%m-%d %H:%M} on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"{run.seconds / 60:.1f} min, `python -m bench fleet-scale{' --quick' if run.quick else ''}`; load average "
        f"{run.load:.1f} as it began (the leader, the swarm and whatever else runs share the cores).",
        "",
        "One real leader (`opod up --no-worker --engine sim`, SQLite) and N simulated nodes in one asyncio process "
        "(`bench/fleet_scale/swarm.py`) that register with a node token and heartbeat every 5 s, signed as a worker signs; "
        "three nodes in four declare 8 × H100 80 GB, every fourth 8 × A100 80 GB with two cards split into MIG 3g.40gb "
        f"instances. {s.models} models, half wanting one H100 and half two (tensor parallel), each with a fallback profile "
        "asking any GPU of at least 40 GB.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(run)]
    lines += [
        "",
        f"- **heartbeat CPU**: the leader's user + system CPU over {s.cpu_seconds:g} s while the fleet only heartbeats "
        "(no models yet), from /proc, as % of one core.",
        f"- **pass**: one reconciler pass finding {s.models} models wanting a replica (their schedule window opens at the same "
        "minute; the pass is woken by `POST /api/v1/models/{name}/retry`), from that call to the last of its load calls "
        "arriving at the simulated workers; in brackets, to the first load call (the pass places every replica before it "
        "calls any worker). **planner**: `fleet.placement.Planner` built over the same nodes placing the same models, in the "
        "benchmark's own process (no leader, no HTTP): the placement work alone.",
        f"- **summary / nodes**: {s.requests} GETs of each, interleaved, one at a time over one kept-alive connection, paced "
        f"over {s.latency_seconds:g} s, from sending to the last byte of the answer, while the fleet heartbeats.",
        f"- **CPU with the replicas**: the leader's CPU over {s.after_seconds:g} s once the replicas are ready "
        "(rounds over the defined models every 3 s, heartbeats listing the models).",
        "- **register / add models**: seconds to register every node (16 at a time), and to add the models one after another.",
        "",
        "## Goals (issue 21)",
        "",
    ]
    lines += [f"- {g}" for g in goals(run)]
    text = growth(run)
    if text:
        lines += ["", text]
    notes = [f"{s.nodes:,} nodes: {n}" for s in run.sizes for n in s.notes]
    side = [
        f"{s.nodes:,} nodes: the swarm used {_f(s.swarm_cpu)} % of a core; a heartbeat's round trip p99 "
        f"{_f(s.beat_p99, 1, 1000)} ms"
        for s in run.sizes
    ]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes + side]
    return "\n".join(lines) + "\n"


def plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [s.nodes for s in run.sizes]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    ax.plot(n, [s.cpu for s in run.sizes], "o-", label="heartbeats only")
    ax.plot(n, [s.cpu_after for s in run.sizes], "s--", label=f"with {run.settings.models} replicas")
    ax.axhline(GOAL_CPU, color="red", linestyle=":", label="goal")
    ax.set_title("leader CPU, % of one core")
    ax = axes[0][1]
    ax.plot(n, [s.pass_seconds for s in run.sizes], "o-", label="pass, to the last load call")
    ax.plot(n, [s.plan_seconds for s in run.sizes], "s--", label="pass, to the first load call")
    ax.plot(n, [run.planner[x].seconds if x in run.planner else math.nan for x in n], "^-.", label="Planner in-process")
    ax.axhline(GOAL_PASS, color="red", linestyle=":", label="goal")
    ax.set_title(f"placing {run.settings.models} models, seconds")
    for ax, attr, title in (
        (axes[1][0], "summary", "GET /api/v1/summary, ms"),
        (axes[1][1], "nodes_view", "GET /api/v1/nodes, ms"),
    ):
        views = [getattr(s, attr) for s in run.sizes]
        ax.plot(n, [v.p50 * 1000 if v else math.nan for v in views], "o-", label="p50")
        ax.plot(n, [v.p99 * 1000 if v else math.nan for v in views], "s--", label="p99")
        ax.axhline(GOAL_P99 * 1000, color="red", linestyle=":", label="goal (p99)")
        ax.set_title(title)
    for ax in axes.flat:
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_xticks(n)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("opod fleet scale: one leader, simulated nodes heartbeating")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(run: Run, results: Path) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / "fleet-scale.md"
    path.write_text(markdown(run))
    plot(run, results / "fleet-scale.png")
    return path
