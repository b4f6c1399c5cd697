"""One run: the fleet up, then every path in turn through every workload, against the same engines.

Paths run one after another (never at once: they share the CPUs and the
engines), and every engine's prefix cache is emptied before each phase so that
no path inherits another's warm cache. The direct path runs first: the open
loop's offered loads are fractions of its capacity.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from bench.routing import decision, load, metrics, oracle, peers, workloads
from bench.routing import fleet as fleet_mod
from bench.routing.fleet import Fleet, SimProfile
from bench.routing.metrics import LatencySummary, StreamSummary
from bench.routing.workloads import PrefixShape

PATHS = ("direct", "opod", "opod-rr", "relay-floor", "litellm", "vllm-router", "vllm-router-cache", "sglang-router")
LABELS = {
    "direct": "direct (client → engines, no hop)",
    "opod": "opod (prefix policy)",
    "opod-rr": "opod (round robin, no policy)",
    "relay-floor": "bare Python relay (a yardstick)",
    "litellm": "LiteLLM proxy",
    "vllm-router": "vllm-router (kv_aware)",
    "vllm-router-cache": "vllm-router (cache_aware)",
    "sglang-router": "sglang-router (cache_aware)",
}
YARDSTICKS = ("direct", "relay-floor")
"""Paths that measure the machine, not a router: they skip the shared-prefix workload."""
PEER = {"vllm-router-cache": "vllm-router"}
"""Paths that run a peer under another name than their own (the same install, another policy)."""


@dataclass(frozen=True)
class Settings:
    workers: int = 8
    seed: int = 0
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    closed_seconds: float = 5.0
    loads: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)
    """Open-loop offered loads, as fractions of the direct path's capacity."""
    open_seconds: float = 10.0
    stream_rate: float = 10.0
    stream_seconds: float = 10.0
    stream_tokens: int = 32
    prefix: PrefixShape = PrefixShape()
    ttft_slo: float = 2.0
    """A workload-3 request counts toward goodput when its TTFT is at most this (seconds)."""
    drain: float = 60.0
    """Seconds an open loop waits for answers after its last send before it gives up on them."""
    profile: SimProfile = SimProfile()
    paths: tuple[str, ...] = PATHS
    peers_dir: Path = peers.DEFAULT_DIR
    quick: bool = False


@dataclass
class PathResult:
    key: str
    label: str
    ran: bool = False
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    sweep: dict[int, LatencySummary] = field(default_factory=dict)
    open: dict[float, LatencySummary] = field(default_factory=dict)
    """Offered rate (req/s) → what the open loop saw."""
    overloaded: dict[float, float] = field(default_factory=dict)
    """Offered rates not run because they exceed this path's own capacity by far → that capacity (req/s)."""
    paired: dict[float, LatencySummary] = field(default_factory=dict)
    """Offered rate → the direct path, measured in turns with this path at that rate (the goals' load only)."""
    cpu_per_request: float = math.nan
    """Seconds of CPU the router's processes spent per request sent, over its runs at the goals' load."""
    stream: StreamSummary | None = None
    prefix: StreamSummary | None = None
    prefix_hit_rate: float = math.nan
    prefix_ttfts: list[float] = field(default_factory=list)

    @property
    def saturation(self) -> float:
        return metrics.saturation(self.sweep)


@dataclass
class RunResult:
    settings: Settings
    paths: list[PathResult]
    oracle: oracle.OracleResult
    prefix_requests: int
    offered: list[float]
    cores: int = field(default_factory=lambda: os.cpu_count() or 0)
    machine: str = field(
        default_factory=lambda: f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"
    )
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M"))
    seconds: float = 0.0
    decisions: list[decision.DecisionCost] = field(default_factory=list)
    """opod's routing decision timed in process with 100 workers, per scenario (when the opod path runs)."""

    def path(self, key: str) -> PathResult | None:
        return next((p for p in self.paths if p.key == key), None)


Step = Callable[[str, int], Callable[[], None]]
"""``step(description, total)`` starts a progress task and returns its advance function."""


def run(settings: Settings, step: Step, say: Callable[[str], None]) -> RunResult:
    began = time.monotonic()
    trace = workloads.shared_prefix_trace(settings.prefix, settings.seed)
    best = oracle.oracle_for_trace(
        (r.messages for r in trace),
        settings.prefix.output_tokens,
        settings.profile.block_size,
        settings.workers,
        settings.profile.kv_blocks,
    )
    results = [PathResult(key, LABELS[key]) for key in PATHS if key in settings.paths or key == "direct"]
    offered: list[float] = []
    decisions: list[decision.DecisionCost] = []
    if "opod" in settings.paths:
        say(f"timing opod's routing decision with {decision.WORKERS} workers, in process")
        decisions = decision.measure()
    with tempfile.TemporaryDirectory(prefix="opod-bench-routing-") as scratch_name:
        scratch = Path(scratch_name)
        say(f"starting the fleet: an opod leader and {settings.workers} workers, one simulator engine each")
        fleet = fleet_mod.start(scratch / "fleet", settings.workers, settings.profile, on_step=say)
        try:
            for result in results:
                _run_path(result, fleet, settings, trace, offered, scratch, step, say)
        finally:
            fleet.stop()
    out = RunResult(settings, results, best, len(trace), offered, decisions=decisions)
    out.seconds = time.monotonic() - began
    return out


def _target(
    result: PathResult, fleet: Fleet, settings: Settings, scratch: Path, say: Callable[[str], None]
) -> tuple[load.Target, peers.RunningPeer | None]:
    key = result.key
    if key == "direct":
        return load.Target(key, tuple(fleet.engines)), None
    if key in ("opod", "opod-rr"):
        policy = fleet_mod.PREFIX_POLICY if key == "opod" else {}
        fleet.set_policy(policy, f"{key}-{time.monotonic_ns()}")
        return load.Target(key, (fleet.url,), {"Authorization": f"Bearer {fleet.key}"}, fleet.leader.proc.pid), None
    if key == "relay-floor":
        peer = peers.start_floor(fleet.engines, fleet_mod.MODEL, scratch)
    else:
        peer = _start_peer(key, fleet, settings, scratch, say)
    result.label = peer.label
    result.notes += peer.notes
    return load.Target(key, (peer.url,), peer.headers, peer.proc.pid), peer


def _start_peer(
    key: str, fleet: Fleet, settings: Settings, scratch: Path, say: Callable[[str], None]
) -> peers.RunningPeer:
    """A peer router from its own virtual environment, installed on first use."""
    spec = peers.SPECS[PEER.get(key, key)]
    venv = settings.peers_dir / spec.name
    if not (venv / peers.MARKER).is_file():
        say(escape(f"installing {spec.requirement} into {venv} (first time only: {spec.first_install})"))
    venv = peers.ensure_installed(spec, settings.peers_dir)
    say(f"starting {key}")
    if key == "litellm":
        return peers.start_litellm(venv, fleet.engines, fleet_mod.MODEL, scratch)
    if key == "vllm-router":
        return peers.start_vllm_router(
            venv,
            fleet.engines,
            fleet_mod.MODEL,
            settings.profile.block_size,
            scratch,
            policy="kv_aware",
            kv_sources=fleet.kv_sources,
        )
    if key == "vllm-router-cache":
        return peers.start_vllm_router(
            venv, fleet.engines, fleet_mod.MODEL, settings.profile.block_size, scratch, policy="cache_aware"
        )
    return peers.start_sglang_router(venv, fleet.engines, fleet_mod.MODEL, scratch)


def _run_path(
    result: PathResult,
    fleet: Fleet,
    settings: Settings,
    trace: list[workloads.TraceRequest],
    offered: list[float],
    scratch: Path,
    step: Step,
    say: Callable[[str], None],
) -> None:
    try:
        target, peer = _target(result, fleet, settings, scratch, say)
    except peers.PeerUnavailable as err:
        result.reason = str(err)
        say(f"[yellow]{result.key} not run:[/] {escape(str(err))}")
        return
    except Exception as err:
        result.reason = f"could not start: {type(err).__name__}: {err}"
        say(f"[yellow]{result.key} not run:[/] {escape(result.reason)}")
        return
    result.ran = True
    try:
        phases: list[tuple[str, Callable[[], None]]] = [
            ("short chat, closed loop", lambda: _sweep(result, target, settings, step)),
            ("short chat, open loop", lambda: _open(result, target, fleet, settings, offered, step)),
            ("streamed chat", lambda: _stream(result, target, settings, step)),
        ]
        if result.key not in YARDSTICKS:
            phases.append(("shared prefix", lambda: _prefix(result, target, fleet, settings, trace, step, peer)))
        for name, phase in phases:
            if not settle(target, result.notes, name) or not _reset(fleet, result):
                break
            try:
                phase()
            except Exception as err:
                result.notes.append(f"{name} failed: {type(err).__name__}: {err}")
                say(f"[red]{result.key}: {name} failed:[/] {escape(str(err))}")
    finally:
        if peer is not None:
            peer.stop()


def _reset(fleet: Fleet, result: PathResult) -> bool:
    try:
        fleet.reset_caches(timeout=120)
        return True
    except (RuntimeError, OSError) as err:  # an engine that will not reset (or died) ends this path, not the run
        result.notes.append(f"stopped early: {err}")
        return False


SETTLE_SECONDS = 180.0
"""How long a path may take to drain what an overload left queued inside it before the next phase."""


def settle(target: load.Target, notes: list[str], phase: str) -> bool:
    """Wait until the path answers one request promptly, so no phase inherits the last one's backlog; when it does
    not within ``SETTLE_SECONDS``, say so in ``notes`` and answer False.

    An overloaded proxy can keep thousands of abandoned requests queued, and a
    router can hold its circuit breakers open for a while after errors; either
    would be charged to the next phase.
    """
    body = workloads.short_chat_body()
    deadline = time.monotonic() + SETTLE_SECONDS
    status, seconds = 0, 0.0
    while time.monotonic() < deadline:
        status, seconds = load.probe(target, body)
        if status == 200 and seconds < 2.0:
            return True
        time.sleep(1.0)
    notes.append(
        f"stopped before {phase}: the path still answered {status or 'nothing'} ({seconds:.1f} s) "
        f"{SETTLE_SECONDS:.0f} s after the previous phase"
    )
    return False


OVERLOAD = 1.5
"""An open-loop load above this multiple of the path's own saturation rate is not run: it could only pile up a backlog."""


def _note_errors(result: PathResult, phase: str, errors: int, first: str) -> None:
    if errors:
        result.notes.append(f"{phase}: {errors} errors, the first: {first or 'no detail'}")


def _sweep(result: PathResult, target: load.Target, settings: Settings, step: Step) -> None:
    advance = step(f"{result.key}: short chat, closed loop", len(settings.concurrency))
    body = workloads.short_chat_body()
    for concurrency in settings.concurrency:
        phase = asyncio.run(load.closed_loop(target, body, concurrency, settings.closed_seconds))
        result.sweep[concurrency] = summary = metrics.latency_summary(phase)
        _note_errors(result, f"short chat at concurrency {concurrency}", summary.errors, summary.first_error)
        advance()


PAIRED_FRACTION = 0.5
"""The offered load (a fraction of direct capacity) at which each path runs in turns with direct: the latency goals' load."""
PAIRED_ROUNDS = 2


def _open(
    result: PathResult, target: load.Target, fleet: Fleet, settings: Settings, offered: list[float], step: Step
) -> None:
    if not offered:
        capacity = result.saturation if result.key == "direct" else math.nan
        if not capacity > 0:
            raise RuntimeError("the direct path measured no capacity, so there is no offered load to run at")
        offered.extend(round(capacity * fraction, 1) for fraction in settings.loads)
    body = workloads.short_chat_body()
    schedules = [
        [(at, body) for at in workloads.poisson_arrivals(rate, settings.open_seconds, settings.seed + i)]
        for i, rate in enumerate(offered)
    ]
    paired_rate = (
        math.nan
        if result.key == "direct"
        else offered[min(range(len(offered)), key=lambda i: abs(settings.loads[i] - PAIRED_FRACTION))]
    )
    sends = [len(s) * (2 * PAIRED_ROUNDS if rate == paired_rate else 1) for rate, s in zip(offered, schedules)]
    advance = step(f"{result.key}: short chat, open loop", sum(sends))
    capacity = result.saturation
    direct = load.Target("direct", tuple(fleet.engines))
    drain = min(settings.drain, 30.0)
    for rate, schedule, count in zip(offered, schedules, sends):
        if result.key != "direct" and capacity > 0 and rate > OVERLOAD * capacity:
            result.overloaded[rate] = capacity
            for _ in range(count):
                advance()
            continue
        if rate == paired_rate:
            # Direct and this path in turns, so a machine whose speed drifts over the run does not
            # charge the drift to the path.
            directs, turns, spent = [], [], 0.0
            for _ in range(PAIRED_ROUNDS):
                directs.append(asyncio.run(load.open_loop(direct, schedule, stream=False, drain=drain, tick=advance)))
                before = load.cpu_by_process(target.pid) if target.pid else {}
                turns.append(asyncio.run(load.open_loop(target, schedule, stream=False, drain=drain, tick=advance)))
                spent += load.cpu_spent(before, load.cpu_by_process(target.pid)) if target.pid else math.nan
            result.paired[rate] = metrics.latency_summary(load.merge(directs))
            phase = load.merge(turns)
            result.cpu_per_request = spent / phase.sent if phase.sent else math.nan
        else:
            phase = asyncio.run(load.open_loop(target, schedule, stream=False, drain=drain, tick=advance))
        result.open[rate] = summary = metrics.latency_summary(phase)
        _note_errors(result, f"short chat at {rate:g} req/s", summary.errors, summary.first_error)


def _stream(result: PathResult, target: load.Target, settings: Settings, step: Step) -> None:
    body = workloads.stream_chat_body(max_tokens=settings.stream_tokens)
    schedule = [
        (at, body)
        for at in workloads.poisson_arrivals(settings.stream_rate, settings.stream_seconds, settings.seed + 100)
    ]
    advance = step(f"{result.key}: streamed chat", len(schedule))
    phase = asyncio.run(load.open_loop(target, schedule, stream=True, drain=min(settings.drain, 30.0), tick=advance))
    result.stream = metrics.stream_summary(phase)
    _note_errors(result, "streamed chat", result.stream.errors, result.stream.first_error)


def _prefix(
    result: PathResult,
    target: load.Target,
    fleet: Fleet,
    settings: Settings,
    trace: list[workloads.TraceRequest],
    step: Step,
    peer: peers.RunningPeer | None = None,
) -> None:
    # A kv_aware router's own counters say whether it credited any worker with a cached prefix in this phase.
    kv_aware = peer is not None and peer.policy == "kv_aware"
    router_before = peers.router_counters(peer) if kv_aware else {}
    before = fleet.cache_counters()
    advance = step(f"{result.key}: shared prefix ({len(trace)} requests)", len(trace))
    schedule = [(r.at, r.body) for r in trace]
    phase = asyncio.run(
        load.open_loop(target, schedule, stream=True, timeout=settings.drain * 2, drain=settings.drain, tick=advance)
    )
    after = fleet.cache_counters()
    if kv_aware:
        result.notes.append(peers.kv_credit_note(router_before, peers.router_counters(peer), "the shared-prefix phase"))
    queried, hits = after[0] - before[0], after[1] - before[1]
    result.prefix = metrics.stream_summary(phase, settings.ttft_slo)
    result.prefix_hit_rate = hits / queried if queried else math.nan
    _note_errors(result, "shared prefix", result.prefix.errors, result.prefix.first_error)
    result.prefix_ttfts = sorted(s.ttft for s in phase.samples if s.ok and s.ttft is not None)
