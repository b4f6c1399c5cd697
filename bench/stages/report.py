"""The stages bench's tables: markdown and JSON in the results folder, and the same tables on the terminal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from bench.guard import GUARD_POLICY
from bench.stages.attribution import ORDER
from bench.stages.fleet import ALL_OFF, ALL_ON, ALL_ON_AREAS, CONFIGS
from bench.stages.measure import CLIENTS, Flame, Profiled, Rounds


@dataclass
class Run:
    command: str
    when: str
    machine: str
    commit: str
    rate: float
    cpu_pass: Profiled
    wall_pass: Profiled
    rounds: dict[str, Rounds]
    round_seconds: float
    timing: tuple[float, float]
    flames: list[Flame]
    flames_skipped: str
    guard_checks: dict[str, str] = field(default_factory=dict)
    """Configuration → what the leader recorded for its checked request, where the guard policy is on."""


@dataclass
class StageRow:
    stage: str
    cpu_us: float
    wall_us: float
    share: float
    unprofiled_us: float


def stage_rows(run: Run) -> list[StageRow]:
    cpu, wall = run.cpu_pass, run.wall_pass
    total = cpu.attributed.total or 1.0
    unprofiled = Rounds.median(run.rounds[ALL_ON].raw_main_us) if ALL_ON in run.rounds else float("nan")
    rows = []
    for stage in ORDER:
        spent = cpu.attributed.seconds[stage]
        rows.append(
            StageRow(
                stage,
                spent / max(cpu.answered, 1) * 1e6,
                wall.attributed.seconds[stage] / max(wall.answered, 1) * 1e6,
                spent / total,
                spent / total * unprofiled,
            )
        )
    return rows


@dataclass
class ConfigRow:
    name: str
    label: str
    answered: int
    errors: int
    cpu_us: float
    main_us: float
    kernel_us: float
    wakes: float
    idle_ms_per_s: float
    cpu_spread: tuple[float, float]
    p50_ms: float
    p99_ms: float
    base: str
    added_cpu_us: float | None
    added_p50_ms: float | None
    added_p99_ms: float | None


def config_rows(run: Run) -> list[ConfigRow]:
    rows = []
    for config in CONFIGS:
        got = run.rounds.get(config.name)
        if got is None:
            continue
        base = run.rounds.get(config.base)
        med = Rounds.median
        rows.append(
            ConfigRow(
                config.name,
                config.label,
                got.answered,
                got.errors,
                med(got.cpu_us),
                med(got.main_us),
                med(got.kernel_us),
                med(got.wakes),
                got.idle_ms_per_s,
                (min(got.cpu_us, default=0.0), max(got.cpu_us, default=0.0)),
                med(got.p50_ms),
                med(got.p99_ms),
                config.base,
                med(got.cpu_us) - med(base.cpu_us) if base else None,
                med(got.p50_ms) - med(base.p50_ms) if base else None,
                med(got.p99_ms) - med(base.p99_ms) if base else None,
            )
        )
    return rows


def _signed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def dominates(run: Run, stages: list[StageRow], configs: list[ConfigRow]) -> list[str]:
    """What the tables say dominates, in a few sentences made of their own numbers."""
    top = sorted(stages, key=lambda r: r.cpu_us, reverse=True)[:3]
    lines = [
        f"- The three largest stages of the event loop's CPU, all on ({ALL_ON_AREAS}): "
        + "; ".join(f"{r.stage} {r.share:.0%}" for r in top)
        + "."
    ]
    by_name = {r.name: r for r in configs}
    if ALL_ON in by_name and ALL_OFF in by_name:
        on, off = by_name[ALL_ON], by_name[ALL_OFF]
        lines.append(
            f"- All on costs the leader {on.cpu_us:.0f} µs of CPU per request against {off.cpu_us:.0f} µs "
            f"with nothing ({on.cpu_us / max(off.cpu_us, 1e-9):.1f}×), and adds {_signed(on.added_p50_ms, 2)} ms "
            f"at p50, {_signed(on.added_p99_ms, 2)} ms at p99."
        )
        threads = on.cpu_us - on.main_us
        lines.append(
            f"- All on, {threads:.0f} µs of the {on.cpu_us:.0f} µs per request are on threads other "
            f"than the event loop's (the store's commits, run off the loop), which the profile does not see."
        )
        lines.append(
            f"- The kernel's part: {on.kernel_us:.0f} µs per request all on ({on.wakes:.1f} wake-ups of the "
            f"event loop), {off.kernel_us:.0f} µs with nothing ({off.wakes:.1f}); no change to opod's Python reaches "
            "it, only fewer system calls and wake-ups per request do."
        )
    tenancy, hooks, policy = by_name.get("tenancy"), by_name.get("guardrail"), by_name.get("guard-policy")
    if tenancy and hooks and policy and hooks.added_cpu_us is not None and policy.added_cpu_us is not None:
        lines.append(
            f"- The guardrail, added to tenancy: as webhooks (one pre, one post, each one more exchange per request "
            f"with a process of its own, whose CPU is not the leader's) {hooks.added_cpu_us:+.0f} µs of the leader's "
            f"CPU, {hooks.wakes - tenancy.wakes:+.1f} wake-ups and {_signed(hooks.added_p50_ms, 2)} ms at p50 per "
            f"request; as the guard policy in process {policy.added_cpu_us:+.0f} µs, "
            f"{policy.wakes - tenancy.wakes:+.1f} wake-ups and {_signed(policy.added_p50_ms, 2)} ms at p50."
        )
    areas = [r for r in configs if r.base == "tenancy" and r.added_cpu_us is not None]
    if areas:
        big = max(areas, key=lambda r: r.added_cpu_us or 0.0)
        lines.append(
            f"- Of the areas added to tenancy, {_area(big)} adds the most CPU: "
            f"{big.added_cpu_us:+.0f} µs per request, {_signed(big.added_p50_ms, 2)} ms at p50."
        )
        inside = [r for r in areas if _in_all_on(r.name)]
        if inside and big not in inside:
            most = max(inside, key=lambda r: r.added_cpu_us or 0.0)
            lines.append(
                f"- {_area(big).capitalize()} is not in all on; of the areas that are, {_area(most)} adds the most: "
                f"{most.added_cpu_us:+.0f} µs per request, {_signed(most.added_p50_ms, 2)} ms at p50."
            )
    opod, upstream = run.timing
    lines.append(
        f"- Server-Timing, sequential requests, all on: opod's own part {opod:.2f} ms, "
        f"the wait on the engine {upstream:.2f} ms (medians)."
    )
    return lines


def _area(row: ConfigRow) -> str:
    return row.label.removeprefix("+ ")


def _in_all_on(name: str) -> bool:
    """Whether configuration ``name``'s areas are all on in the all-on configuration."""
    configs = {c.name: c for c in CONFIGS}
    return name in configs and ALL_ON in configs and configs[name].areas.within(configs[ALL_ON].areas)


def markdown(run: Run) -> str:
    stages, configs = stage_rows(run), config_rows(run)
    cpu, wall = run.cpu_pass, run.wall_pass
    all_on = run.rounds.get(ALL_ON)
    lines = [
        f"# Where a `/v1` request's time goes, stage by stage ({run.when})",
        "",
        f"Command: `{run.command}`",
        "",
        f"Machine: {run.machine}. Commit measured: `{run.commit}`. The load generator, the leaders, their "
        "workers and simulators share the same CPUs, and the machine is shared with other work: the figures "
        "are medians of rounds, and the spread below says how noisy they were.",
        "",
        f"## The stages of a chat completion, all on: {ALL_ON_AREAS} ({cpu.answered} requests profiled)",
        "",
        "A real `opod up --no-worker` leader with two `opod join` workers (prefix routing hashes a request only "
        "where there is a choice), each with a zero-latency simulator, on loopback, open loop at "
        f"{run.rate:.0f} req/s of chats that each open with their own number, as `python -m bench compare` sends "
        "them. The leader runs under `cProfile`, its window open only "
        "while these requests run; each function's own time goes to the stage `bench/stages/attribution.py` "
        "names it under, or to its callers' stages. CPU is the event loop's thread CPU time "
        "(`time.thread_time`); wall is time on the stack (`time.perf_counter`), a second pass: an `await`'s "
        "wait (the engine's answer; all on calls no webhook) is in neither, and shows in the on/off table's latency and "
        "in Server-Timing below. The profiler slows the calls it sees; the last column shares out the leader's "
        "unprofiled CPU per request (main thread, /proc) by each stage's share.",
        "",
        "| stage | CPU µs/req (profiled) | wall µs/req (profiled, on stack) | share of CPU | ≈ CPU µs/req unprofiled |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in stages:
        lines.append(f"| {r.stage} | {r.cpu_us:.1f} | {r.wall_us:.1f} | {r.share:.1%} | {r.unprofiled_us:.1f} |")
    total_cpu = cpu.attributed.total / max(cpu.answered, 1) * 1e6
    total_wall = wall.attributed.total / max(wall.answered, 1) * 1e6
    unprofiled = Rounds.median(all_on.raw_main_us) if all_on else float("nan")
    lines += [
        f"| **total, event loop's thread** | **{total_cpu:.1f}** | **{total_wall:.1f}** | 100% | **{unprofiled:.1f}** |",
        "",
        "Cross-check against /proc (utime + stime of the leader, µs per request):",
        "",
        "| | whole process | event loop's thread |",
        "|---|---:|---:|",
        f"| profiled pass (CPU clock) | {cpu.cpu_s / max(cpu.answered, 1) * 1e6:.0f} | "
        f"{cpu.main_s / max(cpu.answered, 1) * 1e6:.0f} |",
    ]
    if all_on:
        lines.append(
            f"| unprofiled (on/off rounds, all on, median) | {Rounds.median(all_on.raw_cpu_us):.0f} | "
            f"{unprofiled:.0f} |"
        )
    opod, upstream = run.timing
    lines += [
        "",
        f"Server-Timing of sequential requests, all on (medians): opod {opod:.3f} ms, "
        f"upstream (the relay's wait on the engine) {upstream:.3f} ms.",
        "",
        f"## Each governance area on and off ({run.round_seconds:.0f} s rounds at {run.rate:.0f} req/s, interleaved)",
        "",
        "One leader per configuration, all started side by side, each with its own worker and simulator (two "
        "for prefix routing, the policy `python -m bench compare` mounts: `prefixBlockWeight`, `kvWeight`, "
        "`prefixAffinity`). CPU "
        "is the leader process's (every thread) from /proc, per request answered, median of rounds, with the "
        "leader's idle CPU (heartbeats, its loops; measured while the others had their turn) taken out; the "
        "kernel's part is its system time (socket reads and writes, wake-ups), and wake-ups are the times the "
        "event loop's thread was put back on a CPU per request (schedstat), idle ones taken out likewise. p50 "
        "and p99 are medians of the rounds' own. An area's difference is against the configuration it is "
        "added to. The guardrail is measured two ways, each added to tenancy: as the policy file's webhooks (one "
        "`pre`, one `post`, on `bench/webhook.py` in a process of its own, which allows everything) and as the "
        f"settings' guard policy `{GUARD_POLICY}` run in the gateway (every request by `default`: emails redacted "
        "in the request and a whole answer, card numbers and a prompt-injection pattern blocked in the request).",
        "",
        *_guard_checks(run),
        "| configuration | requests | errors | leader CPU µs/req | of which event loop | of which kernel "
        "| event loop wake-ups/req | CPU spread over rounds "
        "| idle CPU ms/s | p50 ms | p99 ms | compared with | CPU µs added | p50 ms added | p99 ms added |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for c in configs:
        lines.append(
            f"| {c.label} | {c.answered} | {c.errors} | {c.cpu_us:.0f} | {c.main_us:.0f} | {c.kernel_us:.0f} | "
            f"{c.wakes:.1f} | "
            f"{c.cpu_spread[0]:.0f}–{c.cpu_spread[1]:.0f} | {c.idle_ms_per_s:.1f} | {c.p50_ms:.2f} | {c.p99_ms:.2f} | {c.base or '—'} | "
            f"{_signed(c.added_cpu_us, 0)} | {_signed(c.added_p50_ms, 2)} | {_signed(c.added_p99_ms, 2)} |"
        )
    lines += ["", "## Flame graphs (py-spy, all on and nothing, at half the leader's saturation)", ""]
    if run.flames:
        for f in run.flames:
            links = ", ".join(f"[{name}]({name})" for name in f.files)
            lines.append(
                f"- {f.config}: saturation {f.saturation_rps:.0f} req/s (closed loop, {CLIENTS} clients), "
                f"recorded at {f.rate:.0f} req/s, {f.errors} errors: {links}"
            )
        lines += [
            "",
            "py-spy reads Python's frames only: time in the event loop's own C code (uvloop, asyncio's C tasks and "
            "futures, the interpreter's work between frames, the system calls) shows as `Runner.run` with no Python "
            "function above it; `perf record` on the leader splits that part by library.",
        ]
    else:
        lines.append(f"Skipped: {run.flames_skipped}")
    lines += ["", "## What dominates", "", *dominates(run, stages, configs), ""]
    return "\n".join(lines)


def _guard_checks(run: Run) -> list[str]:
    if not run.guard_checks:
        return []
    said = "; ".join(f"{name}: {check}" for name, check in run.guard_checks.items())
    return [f"Checked before measuring, one request's record where the guard policy is on: {said}.", ""]


def write(run: Run, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "stages.md").write_text(markdown(run))
    data = {
        "commit": run.commit,
        "stages": [vars(r) for r in stage_rows(run)],
        "configs": [
            vars(r) | {"statuses": run.rounds[r.name].statuses, "guard_check": run.guard_checks.get(r.name, "")}
            for r in config_rows(run)
        ],
        "flames": [vars(f) for f in run.flames],
        "flames_skipped": run.flames_skipped,
    }
    (out / "stages.json").write_text(json.dumps(data, indent=1))
    return out / "stages.md"


def tables(run: Run) -> list[Table]:
    stages = Table(title=f"a /v1 chat request's stages, all on: {ALL_ON_AREAS} (µs per request)", header_style="bold")
    for column in ("stage", "CPU (profiled)", "wall on stack (profiled)", "share", "≈ CPU unprofiled"):
        stages.add_column(column, justify="left" if column == "stage" else "right")
    for r in stage_rows(run):
        stages.add_row(r.stage, f"{r.cpu_us:.1f}", f"{r.wall_us:.1f}", f"{r.share:.1%}", f"{r.unprofiled_us:.1f}")
    areas = Table(title="governance areas on and off (leader CPU µs per request, latency ms)", header_style="bold")
    columns = ("configuration", "errors", "CPU", "event loop", "kernel", "wake-ups", "p50", "p99", "vs", "+CPU")
    for column in (*columns, "+p50", "+p99"):
        areas.add_column(column, justify="left" if column in ("configuration", "vs") else "right")
    for c in config_rows(run):
        areas.add_row(
            c.name,
            str(c.errors),
            f"{c.cpu_us:.0f}",
            f"{c.main_us:.0f}",
            f"{c.kernel_us:.0f}",
            f"{c.wakes:.1f}",
            f"{c.p50_ms:.2f}",
            f"{c.p99_ms:.2f}",
            c.base or "—",
            _signed(c.added_cpu_us, 0),
            _signed(c.added_p50_ms, 2),
            _signed(c.added_p99_ms, 2),
        )
    return [stages, areas]
