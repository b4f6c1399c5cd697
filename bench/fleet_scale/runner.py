"""One fleet size end to end: a real leader, the swarm of simulated nodes, then each measurement in turn.

For N nodes: ``opod up --no-worker --engine sim`` in a home of its own (SQLite), a node token
from ``POST /api/v1/node-tokens``, the swarm registering N nodes and heartbeating; then

1. the leader's CPU while the fleet only heartbeats (no models yet);
2. ``GET /api/v1/summary`` and ``GET /api/v1/nodes``, interleaved, one at a time, paced over a
   few heartbeat intervals;
3. 500 models added through ``POST /api/v1/models``, each on demand outside a schedule window
   that opens at the next whole minute and asks one replica inside it: at that minute one pass
   finds 500 models wanting a replica. The pass is started at once (``POST
   /api/v1/models/{name}/retry`` wakes the reconciler) and timed from that call to the 500th
   load call the swarm receives (placement and the calls to the workers, as a user waits for
   them), and to the moment ``GET /api/v1/replicas`` lists 500;
4. the leader's CPU again once the 500 replicas are ready (rounds over 500 defined models).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from bench.fleet_scale import measure, shape
from bench.fleet_scale.measure import Api, Latency
from bench.ports import free_port
from bench.procs import Proc, wait_http

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    models: int = 500
    cpu_seconds: float = 20.0
    requests: int = 200
    """GETs of each of summary and nodes."""
    latency_seconds: float = 15.0
    """The span the GETs are paced over (three heartbeat intervals)."""
    after_seconds: float = 10.0
    """CPU measured once the replicas are ready."""


@dataclass
class SizeResult:
    nodes: int
    register_seconds: float = math.nan
    cpu: float = math.nan
    """The leader's CPU, % of one core, while the fleet only heartbeats."""
    swarm_cpu: float = math.nan
    beat_p99: float = math.nan
    """A heartbeat's round trip as the simulated workers saw it, during the CPU measurement."""
    summary: Latency | None = None
    nodes_view: Latency | None = None
    nodes_bytes: int = 0
    post_seconds: float = math.nan
    pass_seconds: float = math.nan
    """From the call that wakes the reconciler to the last of the pass's load calls arriving."""
    plan_seconds: float = math.nan
    """From that call to the first load call: the pass's placement before it calls any worker."""
    listed_seconds: float = math.nan
    """From that call until ``GET /api/v1/replicas`` lists every replica."""
    replicas: int = 0
    cpu_after: float = math.nan
    """The leader's CPU with the replicas ready and the fleet heartbeating."""
    notes: list[str] = field(default_factory=list)


class Swarm:
    """The simulated nodes' process (``bench.fleet_scale.swarm``) and its status listener."""

    def __init__(self, leader_url: str, token: str, nodes: int, log: Path) -> None:
        self.port = free_port()
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.fleet_scale.swarm",
                "--leader",
                leader_url,
                "--token",
                token,
                "--nodes",
                str(nodes),
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.api = Api(f"http://127.0.0.1:{self.port}", "")

    def status(self) -> dict:
        return self.api.ok("GET", "/swarm/status")

    def wait_registered(self, nodes: int, timeout: float) -> None:
        wait_http(f"http://127.0.0.1:{self.port}/swarm/status", 120)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status["registered"] >= nodes:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(
            f"{nodes} nodes did not register within {timeout:.0f}s: {self.status() if self.proc.poll() is None else 'swarm exited'}"
        )

    def stop(self) -> None:
        self.api.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _cpu_both(leader: int, swarm: int, seconds: float) -> tuple[float, float]:
    start = time.monotonic()
    a, b = measure.cpu_seconds(leader), measure.cpu_seconds(swarm)
    time.sleep(seconds)
    wall = time.monotonic() - start
    return 100 * (measure.cpu_seconds(leader) - a) / wall, 100 * (measure.cpu_seconds(swarm) - b) / wall


def _interleaved(api: Api, paths: list[str], count: int, spread: float) -> dict[str, Latency]:
    """``count`` GETs of each path, alternating, paced over ``spread`` seconds; one request at a time."""
    times: dict[str, list[float]] = {p: [] for p in paths}
    errors = dict.fromkeys(paths, 0)
    gap = spread / (count * len(paths))
    due = time.monotonic()
    for _ in range(count):
        for path in paths:
            time.sleep(max(due - time.monotonic(), 0))
            due += gap
            status, _, elapsed = api.call("GET", path)
            if status == 200:
                times[path].append(elapsed)
            else:
                errors[path] += 1
    return {
        p: Latency(measure.percentile(t, 50), measure.percentile(t, 99), len(t), errors[p]) for p, t in times.items()
    }


def _next_minute(after: float) -> datetime:
    """The first whole minute (local time, as the reconciler reads schedules) at least ``after`` seconds from now."""
    at = datetime.now() + timedelta(seconds=after)
    return at.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _add_models(api: Api, count: int, opens: datetime) -> None:
    window = (opens.strftime("%H:%M"), (opens + timedelta(hours=2)).strftime("%H:%M"))
    for j in range(count):
        api.ok("POST", "/api/v1/models", shape.model_definition(j, window))


def _time_pass(
    api: Api, swarm: Swarm, result: SizeResult, settings: Settings, opens: datetime, step: Callable[[str], None]
) -> None:
    before = swarm.status()["loads"]
    if before:
        # Adding the models outran the minute: they were placed as they came, not in one pass.
        result.notes.append(
            f"{before} loads arrived before the window opened (adding the models took longer than foreseen); "
            "the pass is not timed"
        )
        return
    opens_at = opens.timestamp()
    step(f"waiting {max(opens_at - time.time(), 0):.0f}s for the window to open at {opens:%H:%M}")
    time.sleep(max(opens_at + 0.02 - time.time(), 0))
    kicked = time.time()
    api.ok("POST", f"/api/v1/models/{shape.model_name(0)}/retry", {})
    deadline = time.monotonic() + 120
    status: dict = {}
    while time.monotonic() < deadline:
        status = swarm.status()
        if not math.isfinite(result.listed_seconds):
            replicas = api.ok("GET", "/api/v1/replicas")
            result.replicas = len(replicas)
            if len(replicas) >= settings.models:
                result.listed_seconds = time.time() - kicked
        if status["loads"] >= settings.models and math.isfinite(result.listed_seconds):
            break
        time.sleep(0.1)
    if status.get("loads", 0) < settings.models:
        result.notes.append(f"only {status.get('loads', 0)} of {settings.models} loads arrived within 120 s")
        return
    if status["first_load"] < kicked:
        result.notes.append(
            "a periodic round began before the wake-up call: the pass is timed from the window's opening"
        )
        kicked = opens_at
    result.pass_seconds = status["last_load"] - kicked
    result.plan_seconds = status["first_load"] - kicked


def _wait_ready(api: Api, models: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    ready = 0
    while time.monotonic() < deadline:
        ready = sum(1 for r in api.ok("GET", "/api/v1/replicas") if r.get("state") == "ready")
        if ready >= models:
            break
        time.sleep(1.0)
    return ready


def run_size(nodes: int, settings: Settings, home: Path, step: Callable[[str], None]) -> SizeResult:
    result = SizeResult(nodes)
    home.mkdir(parents=True, exist_ok=True)
    port, admin_port = free_port(), free_port()
    step(f"{nodes} nodes: starting the leader")
    leader = Proc(
        [
            "up",
            "--no-worker",
            "--engine",
            "sim",
            "--no-default-models",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin_port}",
        ],
        home / "leader",
    )
    swarm: Swarm | None = None
    api: Api | None = None
    try:
        leader.wait_for("OpenAI API on", 90)
        api = Api(f"http://127.0.0.1:{admin_port}", (home / "leader" / "admin.key").read_text().strip())
        token = api.ok("POST", "/api/v1/node-tokens", {"name": "fleet-scale"})["secret"]
        step(f"{nodes} nodes: registering the swarm")
        started = time.monotonic()
        swarm = Swarm(f"http://127.0.0.1:{port}", token, nodes, home / "swarm.log")
        swarm.wait_registered(nodes, timeout=180)
        result.register_seconds = time.monotonic() - started
        time.sleep(6.0)  # one whole heartbeat interval: every node has beaten since it registered
        swarm.status()  # resets the swarm's round-trip sample
        step(f"{nodes} nodes: the leader's CPU while the fleet heartbeats ({settings.cpu_seconds:.0f}s)")
        result.cpu, result.swarm_cpu = _cpu_both(leader.proc.pid, swarm.proc.pid, settings.cpu_seconds)
        status = swarm.status()
        result.beat_p99 = status["beat_p99"] or math.nan
        if status["beat_errors"] or status["reregistered"]:
            result.notes.append(
                f"{status['beat_errors']} heartbeats failed, {status['reregistered']} re-registered: {status['last_error']}"
            )
        step(f"{nodes} nodes: summary and nodes latency ({settings.requests} each)")
        views = _interleaved(api, ["/api/v1/summary", "/api/v1/nodes"], settings.requests, settings.latency_seconds)
        result.summary, result.nodes_view = views["/api/v1/summary"], views["/api/v1/nodes"]
        for path, view in views.items():
            if view.errors:
                result.notes.append(f"{view.errors} of {settings.requests} GETs of {path} did not answer 200")
        _, listed, _ = api.call("GET", "/api/v1/nodes")
        result.nodes_bytes = len(json.dumps(listed))
        if isinstance(listed, list) and len(listed) != nodes:
            result.notes.append(f"GET /api/v1/nodes listed {len(listed)} nodes, not {nodes}")
        # Adding a model costs more the larger the fleet (about 10 ms + 40 µs a node here): the window opens after the last.
        opens = _next_minute(after=10.0 + 1.5 * settings.models * (0.010 + 0.00004 * nodes))
        step(f"{nodes} nodes: adding {settings.models} models (their window opens at {opens:%H:%M})")
        started = time.monotonic()
        _add_models(api, settings.models, opens)
        result.post_seconds = time.monotonic() - started
        _time_pass(api, swarm, result, settings, opens, step)
        ready = _wait_ready(api, settings.models)
        if ready < settings.models:
            result.notes.append(f"{ready} of {settings.models} replicas ready 30 s after the pass")
        step(f"{nodes} nodes: the leader's CPU with {ready} replicas ready ({settings.after_seconds:.0f}s)")
        result.cpu_after, _ = _cpu_both(leader.proc.pid, swarm.proc.pid, settings.after_seconds)
    finally:
        if api is not None:
            api.close()
        if swarm is not None:
            swarm.stop()
        leader.stop()
    return result
