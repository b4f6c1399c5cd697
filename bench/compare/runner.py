"""One compare run: the latency fleet, then the zero-latency fleet, each path measured in interleaved rounds.

On the first fleet (the simulator's latency model, as bench/routing runs it) every round sends,
path after path in an order that turns each round: chats at concurrency 8, then streamed chats at
concurrency 8, then (once direct's saturation is known) Poisson arrivals at half of it. On the
second fleet (engines that answer at once) the same rounds find each path's saturation. Rounds are
interleaved so that a shared machine's drift falls on every path alike; ``added`` compares a path
with the direct rounds measured beside it.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from bench.compare import governance
from bench.procs import checkout_commit, process_tree
from bench.routing import fleet as fleet_mod
from bench.routing import load, metrics, peers, workloads
from bench.routing.fleet import Fleet, SimProfile
from bench.routing.load import Phase, Target
from bench.routing.runner import Step, settle

CHOICES = ("direct", "opod", "opod-webhook", "relay-floor", "governed-floor", "sglang-router")
"""Every path a run may measure, in the table's order."""
PATHS = ("direct", "opod", "relay-floor", "governed-floor", "sglang-router")
"""The paths a run measures unless told otherwise; ``opod-webhook`` is asked for (``--path opod-webhook``)."""
DISTINCT = 4096
"""Chats sent in turn, each opening with its own number (``workloads.distinct_chat_bodies``)."""
LABELS = {
    "direct": "direct (client → engines, round robin, no hop)",
    "opod": "opod, every governance area on, guardrail: guard policy in process (prefix policy)",
    "opod-webhook": "opod, every governance area on, guardrail: policy-file webhook (prefix policy)",
    "relay-floor": "bare Python relay (uvloop + httptools; a yardstick)",
    "governed-floor": "governed Python relay (the bare relay plus each governance area's least work; a yardstick)",
    "sglang-router": "sglang-router 0.3.2 (cache_aware)",
}
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    workers: int = 4
    rounds: int = 3
    concurrency: int = 8
    seconds: float = 8.0
    """Seconds measured per path and round at concurrency 8 (chat, and streamed): over three rounds, about 900 chats
    and 450 streams per path, so each p99 rests on its slowest nine and four, not on two or three."""
    chat_tokens: int = 8
    stream_tokens: int = 16
    capacity_levels: tuple[int, ...] = (128, 256)
    """Closed-loop concurrencies of direct's saturation on the latency fleet (the open loop's reference)."""
    capacity_seconds: float = 3.0
    load_fraction: float = 0.5
    open_seconds: float = 5.0
    """Seconds of arrivals per path and round of the open loop."""
    zero_levels: tuple[int, ...] = (32, 128)
    """Closed-loop concurrencies of the saturation rounds, on engines that answer at once."""
    zero_seconds: float = 3.0
    zero_rounds: int = 2
    drain: float = 30.0
    seed: int = 0
    paths: tuple[str, ...] = PATHS
    peers_dir: Path = peers.DEFAULT_DIR
    profile: SimProfile = SimProfile()


@dataclass
class PathRun:
    key: str
    label: str
    ran: bool = True
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    chat: list[Phase] = field(default_factory=list)
    stream: list[Phase] = field(default_factory=list)
    open: list[Phase] = field(default_factory=list)
    saturation: dict[int, list[Phase]] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    """CPU of the router's processes over its open-loop rounds (nan for direct)."""
    wait_seconds: float = 0.0
    """Time the router's threads waited for a core over its open-loop rounds (run-queue delay; nan for direct)."""
    side_cpu_seconds: float = 0.0
    """CPU of what the router calls besides the engines over the same rounds (opod-webhook: the guardrail webhook)."""
    spread: dict[str, list[int]] = field(default_factory=dict)
    """Phase → requests each engine took from this path over its rounds (how the router placed them)."""
    saturation_cpu: dict[int, float] = field(default_factory=dict)
    """Saturation level → CPU of the router's processes over that level's measured windows (none for direct)."""

    def requests(self) -> tuple[int, int]:
        """(answered, failed) over every phase."""
        phases = [*self.chat, *self.stream, *self.open, *(p for ps in self.saturation.values() for p in ps)]
        ok = sum(1 for p in phases for s in p.samples if s.ok)
        return ok, sum(p.sent for p in phases) - ok

    @property
    def open_sent(self) -> int:
        return sum(p.sent for p in self.open)

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_seconds / self.open_sent if self.open_sent and self.key != "direct" else math.nan

    @property
    def wait_per_request(self) -> float:
        return self.wait_seconds / self.open_sent if self.open_sent and self.key != "direct" else math.nan

    @property
    def side_cpu_per_request(self) -> float:
        return self.side_cpu_seconds / self.open_sent if self.open_sent and self.side_cpu_seconds else math.nan

    @property
    def saturation_cpu_per_request(self) -> float:
        """CPU seconds per request answered at the best saturation level, over its measured windows; nan without."""
        _, level = self.best_saturation()
        answered = sum(1 for p in self.saturation.get(level, ()) for s in p.samples if s.ok)
        if level not in self.saturation_cpu or not answered:
            return math.nan
        return self.saturation_cpu[level] / answered

    def best_saturation(self) -> tuple[float, int]:
        """(req/s, concurrency) of the best saturation level; (nan, 0) when none answered."""
        best = (math.nan, 0)
        for level, phases in self.saturation.items():
            rps = metrics.latency_summary(load.merge(phases)).rps
            if rps > 0 and not rps <= best[0]:
                best = (rps, level)
        return best


@dataclass
class CompareResult:
    settings: Settings
    paths: list[PathRun]
    command: str
    commit: str
    capacity: dict[int, metrics.LatencySummary] = field(default_factory=dict)
    """Direct's closed loop on the latency fleet, by concurrency."""
    offered: float = math.nan
    governance: list[str] = field(default_factory=list)
    """What each governed path's check request showed on each fleet, and how often their guardrails were swapped."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 0)
    machine: str = field(
        default_factory=lambda: f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"
    )
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M"))
    load_before: float = field(default_factory=lambda: os.getloadavg()[0])
    seconds: float = 0.0

    def path(self, key: str) -> PathRun | None:
        return next((p for p in self.paths if p.key == key), None)


def invocation() -> str:
    """The command this run was started with, as a user would type it again."""
    return "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@dataclass
class Lane:
    """One path on one fleet: where its requests go and what runs for it."""

    run: PathRun
    target: Target
    stops: list[Callable[[], None]] = field(default_factory=list)
    side_pid: int | None = None
    before: Callable[[], None] | None = None
    """Run before each of the path's turns (opod and opod-webhook: their own guardrail put in force)."""


def run(settings: Settings, step: Step, say: Callable[[str], None]) -> CompareResult:
    began = time.monotonic()
    result = CompareResult(
        settings, [PathRun(k, LABELS[k]) for k in CHOICES if k in settings.paths], invocation(), checkout_commit(ROOT)
    )
    with tempfile.TemporaryDirectory(prefix="opod-bench-compare-") as scratch_name:
        scratch = Path(scratch_name)
        say(f"starting the latency fleet: an opod leader and {settings.workers} workers, one simulator engine each")
        _on_fleet(
            scratch / "latency",
            settings.profile,
            settings,
            result,
            say,
            lambda lanes, fleet: _latency(lanes, fleet, settings, result, step),
        )
        zero = SimProfile(time_scale=0.0, max_num_seqs=1024, seed=settings.seed)
        say("starting the zero-latency fleet (engines that answer at once)")
        _on_fleet(
            scratch / "zero", zero, settings, result, say, lambda lanes, fleet: _saturation(lanes, settings, step)
        )
    result.seconds = time.monotonic() - began
    return result


def _on_fleet(
    scratch: Path,
    profile: SimProfile,
    settings: Settings,
    result: CompareResult,
    say: Callable[[str], None],
    measure: Callable[[list[Lane], Fleet], None],
) -> None:
    scratch.mkdir(parents=True)
    fleet = fleet_mod.start(scratch / "fleet", settings.workers, profile, on_step=say)
    lanes: list[Lane] = []
    governed: governance.Governed | None = None
    try:
        keys = [p.key for p in result.paths if p.ran and p.key in governance.GUARDRAILS]
        if keys:
            guardrails = " and ".join(_GUARDRAIL_SAID[governance.GUARDRAILS[k]] for k in keys)
            say(
                f"{' and '.join(keys)}: an org, team and project, its key, a price, a budget, kept bodies, {guardrails}"
            )
            governed = governance.enable(fleet, scratch, keys)
            result.governance += [
                f"{k}: governance checked on the {_FLEETS[scratch.name]}: {governed.checks[governance.GUARDRAILS[k]]}"
                for k in keys
            ]
            result.governance.append(
                f"opod: the leader of the {_FLEETS[scratch.name]}, as its log says: {_placed_as(fleet)}"
            )
            result.governance.append(f"the {_FLEETS[scratch.name]}'s workers and engines: {_cpus_of_workers(fleet)}")
        for path in result.paths:
            if not path.ran:
                continue
            lane = _lane(path, fleet, settings, scratch, governed, say)
            if lane is not None:
                lanes.append(lane)
        measure(lanes, fleet)
    finally:
        for lane in lanes:
            for stop in lane.stops:
                stop()
        if governed is not None:
            governed.stop()
            if governed.switches:
                result.governance.append(
                    f"opod and opod-webhook share the {_FLEETS[scratch.name]}'s leader, so each of their turns began by "
                    f"putting its own guardrail in force: {governed.switches} swaps, each a settings version and a "
                    "policy file, outside the measured time"
                )
        fleet.stop()


_FLEETS = {"latency": "latency fleet", "zero": "zero-latency fleet"}
PLACED = re.compile(r"opod\.(?:heap|cpu): (.*)$")


def _placed_as(fleet: Fleet) -> str:
    """What the leader's log says of its heap and its event loop's CPU (``opod.cli.heap``, ``opod.http.cpu``)."""
    said = [found.group(1) for line in list(fleet.leader.lines) if (found := PLACED.search(line))]
    return "; ".join(said) or "its log says nothing of its heap or its event loop's CPU"


def _cpus_of_workers(fleet: Fleet) -> str:
    """The CPUs the workers and the engines they started may run on (``OPOD_ENGINE_CPUS``), as the kernel has them."""

    def cpus(pids: list[int]) -> str:
        sets = set()
        for pid in pids:
            try:
                sets.add(",".join(map(str, sorted(os.sched_getaffinity(pid)))))
            except OSError:  # ended meanwhile
                continue
        return " / ".join(sorted(sets)) or "none seen"

    workers = [worker.proc.pid for worker in fleet.workers.values()]
    engines = [pid for worker in workers for pid in process_tree(worker)[1:]]
    return f"workers on CPUs {cpus(workers)}, engines on CPUs {cpus(engines)}"


_GUARDRAIL_SAID = {"policy": "the guard policy (settings)", "webhook": "a guardrail webhook (policy file)"}


def _lane(
    path: PathRun,
    fleet: Fleet,
    settings: Settings,
    scratch: Path,
    governed: governance.Governed | None,
    say: Callable[[str], None],
) -> Lane | None:
    if path.key == "direct":
        return Lane(path, Target("direct", tuple(fleet.engines)))
    if path.key in governance.GUARDRAILS:
        assert governed is not None
        guardrail = governance.GUARDRAILS[path.key]
        target = Target(path.key, (fleet.url,), {"Authorization": f"Bearer {governed.key}"}, fleet.leader.proc.pid)
        side = governed.webhook.proc.pid if guardrail == "webhook" and governed.webhook is not None else None
        shared = governed
        return Lane(path, target, side_pid=side, before=lambda: shared.use(guardrail))
    if path.key == "relay-floor":
        say("starting the bare Python relay (the least one Python hop costs here)")
        floor = peers.start_floor(fleet.engines, fleet_mod.MODEL, scratch)
        return Lane(path, Target("relay-floor", (floor.url,), floor.headers, floor.proc.pid), [floor.stop])
    if path.key == "governed-floor":
        say("starting the governed Python relay (the least governance costs one Python hop)")
        relay = peers.start_governed_floor(fleet.engines, fleet_mod.MODEL, scratch)
        return Lane(path, Target("governed-floor", (relay.url,), relay.headers, relay.proc.pid), [relay.stop])
    spec = peers.SPECS["sglang-router"]
    try:
        if not (settings.peers_dir / spec.name / peers.MARKER).is_file():
            say(
                escape(
                    f"installing {spec.requirement} into {settings.peers_dir / spec.name} (first time only: {spec.first_install})"
                )
            )
        venv = peers.ensure_installed(spec, settings.peers_dir)
        say("starting sglang-router")
        peer = peers.start_sglang_router(venv, fleet.engines, fleet_mod.MODEL, scratch)
    except peers.PeerUnavailable as err:
        path.ran, path.reason = False, str(err)
        say(f"[yellow]sglang-router not run:[/] {escape(str(err))}")
        return None
    return Lane(path, Target("sglang-router", (peer.url,), peer.headers, peer.proc.pid), [peer.stop])


def _turns(lanes: list[Lane], rounds: int) -> list[list[Lane]]:
    """Each round's order: the paths turned by one each round, so none always goes first."""
    return [lanes[r % len(lanes) :] + lanes[: r % len(lanes)] for r in range(rounds)] if lanes else []


def _ready(lane: Lane, phase: str) -> bool:
    if lane.before is not None:
        lane.before()
    if settle(lane.target, lane.run.notes, phase):
        return True
    lane.run.ran, lane.run.reason = False, f"no prompt answer before {phase}"
    return False


def _placed(fleet: Fleet, run: PathRun, phase: str, before: list[int]) -> None:
    moved = [after - was for after, was in zip(fleet.served(), before)]
    run.spread[phase] = [a + b for a, b in zip(run.spread.get(phase, [0] * len(moved)), moved)]


def _latency(lanes: list[Lane], fleet: Fleet, settings: Settings, result: CompareResult, step: Step) -> None:
    chat = workloads.distinct_chat_bodies(DISTINCT, settings.chat_tokens)
    streamed = workloads.distinct_chat_bodies(DISTINCT, settings.stream_tokens, stream=True)
    c = settings.concurrency
    for name, body, stream, sink in (
        (f"chat at concurrency {c}", chat, False, "chat"),
        (f"streamed chat at concurrency {c}", streamed, True, "stream"),
    ):
        advance = step(name, settings.rounds * len(lanes))
        for order in _turns(lanes, settings.rounds):
            for lane in order:
                if lane.run.ran and _ready(lane, name):
                    before = fleet.served()
                    phase = asyncio.run(load.closed_loop(lane.target, body, c, settings.seconds, stream=stream))
                    getattr(lane.run, sink).append(phase)
                    _placed(fleet, lane.run, name, before)
                advance()
    direct = next((lane for lane in lanes if lane.run.key == "direct"), None)
    if direct is None:
        return
    advance = step("direct's saturation (the open loop's reference)", len(settings.capacity_levels))
    for level in settings.capacity_levels:
        phase = asyncio.run(load.closed_loop(direct.target, chat, level, settings.capacity_seconds))
        result.capacity[level] = metrics.latency_summary(phase)
        advance()
    capacity = metrics.saturation(result.capacity)
    if not capacity > 0:
        direct.run.notes.append("direct answered nothing at saturation, so the open loop did not run")
        return
    result.offered = rate = round(capacity * settings.load_fraction, 1)
    arrivals = workloads.poisson_arrivals(rate, settings.open_seconds, settings.seed)
    schedule = [(at, chat[i % len(chat)]) for i, at in enumerate(arrivals)]
    advance = step(f"chat, open loop at {rate:,.0f} req/s", settings.rounds * len(lanes) * len(schedule))
    for order in _turns(lanes, settings.rounds):
        for lane in order:
            if not (lane.run.ran and _ready(lane, f"the open loop at {rate:,.0f} req/s")):
                continue
            pid, side = lane.target.pid, lane.side_pid
            cpu_before = (load.cpu_seconds(pid) if pid else 0.0, load.cpu_seconds(side) if side else 0.0)
            wait_before = load.cpu_wait_seconds(pid) if pid else 0.0
            served = fleet.served()
            phase = asyncio.run(load.open_loop(lane.target, schedule, stream=False, drain=settings.drain, tick=advance))
            lane.run.open.append(phase)
            _placed(fleet, lane.run, f"the open loop at {rate:,.0f} req/s", served)
            if pid:
                lane.run.cpu_seconds += load.cpu_seconds(pid) - cpu_before[0]
                lane.run.wait_seconds += load.cpu_wait_seconds(pid) - wait_before
            if side:
                lane.run.side_cpu_seconds += load.cpu_seconds(side) - cpu_before[1]


def _saturation(lanes: list[Lane], settings: Settings, step: Step) -> None:
    chat = workloads.distinct_chat_bodies(DISTINCT, settings.chat_tokens)
    advance = step(
        "saturation, engines that answer at once", settings.zero_rounds * len(settings.zero_levels) * len(lanes)
    )
    for order in _turns(lanes, settings.zero_rounds):
        for level in settings.zero_levels:
            for lane in order:
                if lane.run.ran and _ready(lane, f"saturation at concurrency {level}"):
                    _saturated(lane, chat, level, settings.zero_seconds)
                advance()


def _saturated(lane: Lane, chat: list[bytes], level: int, seconds: float) -> None:
    """One closed loop at ``level``; the router's CPU is read as its measured window opens and closes."""
    pid = lane.target.pid
    marks: list[float] = []

    def mark() -> None:
        marks.append(load.cpu_seconds(pid))

    phase = asyncio.run(load.closed_loop(lane.target, chat, level, seconds, at_window=mark if pid else None))
    lane.run.saturation.setdefault(level, []).append(phase)
    if len(marks) == 2:
        lane.run.saturation_cpu[level] = lane.run.saturation_cpu.get(level, 0.0) + marks[1] - marks[0]
