"""The stages bench's measurements: governance areas on and off, the profiled passes, the flame graphs."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import loadgen
from bench.routing.workloads import distinct_chat_bodies
from bench.stages.attribution import Attributed, attribute, resolve
from bench.stages.fleet import CpuSample, Member, cpu_sample
from bench.tenancy_overhead import BODY

PAYLOADS = distinct_chat_bodies(4096, BODY["max_tokens"])
"""The measured chats, sent in turn: each opens with its own number, so prefix routing meets new prompts as
``python -m bench compare`` sends them."""
Tick = Callable[[], None]
CLIENTS = 32
"""Clients of the closed loop that finds a leader's saturation."""


@dataclass
class Rounds:
    """One configuration's measured rounds, and its leader's CPU while the other configurations were measured.

    A leader spends CPU with no request at all (heartbeats, its loops); that idle rate, measured while it
    waits its turn, is taken out of each round's CPU, so the CPU per request is the requests' own.
    """

    answered_by_round: list[int] = field(default_factory=list)
    spent: list[CpuSample] = field(default_factory=list)
    """What the leader's counters moved by in each round."""
    elapsed_s: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    idle_spent: CpuSample = CpuSample(0.0, 0.0, 0.0, 0.0)
    """What they moved by, all told, while the other configurations had their turns."""
    idle_s: float = 0.0

    def add(self, got: loadgen.Result, spent: CpuSample, elapsed: float) -> None:
        self.answered_by_round.append(len(got.latencies))
        self.spent.append(spent)
        self.elapsed_s.append(elapsed)
        self.p50_ms.append(got.pct(50) * 1000)
        self.p99_ms.append(got.pct(99) * 1000)
        self.errors += got.errors
        for status, count in got.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + count

    def idle(self, spent: CpuSample, elapsed: float) -> None:
        self.idle_spent = self.idle_spent.plus(spent)
        self.idle_s += elapsed

    @property
    def answered(self) -> int:
        return sum(self.answered_by_round)

    @property
    def idle_ms_per_s(self) -> float:
        """The leader's CPU with no requests, ms per second (every thread)."""
        return self.idle_spent.cpu / self.idle_s * 1000 if self.idle_s else 0.0

    def _net(self, counter: str, unit: float = 1e6) -> list[float]:
        """Each round's ``counter`` per request, the idle rate over the round's time taken out, in ``unit``."""
        idle = getattr(self.idle_spent, counter)
        rate = idle / self.idle_s if self.idle_s else 0.0
        return [
            (getattr(spent, counter) - rate * elapsed) / max(n, 1) * unit
            for spent, elapsed, n in zip(self.spent, self.elapsed_s, self.answered_by_round, strict=True)
        ]

    def _raw(self, counter: str) -> list[float]:
        return [getattr(s, counter) / max(n, 1) * 1e6 for s, n in zip(self.spent, self.answered_by_round, strict=True)]

    @property
    def cpu_us(self) -> list[float]:
        """Each round's leader CPU per request, every thread, its idle CPU taken out (µs)."""
        return self._net("cpu")

    @property
    def main_us(self) -> list[float]:
        """The same, the event loop's thread only."""
        return self._net("main")

    @property
    def kernel_us(self) -> list[float]:
        """The same, the kernel's part (every thread)."""
        return self._net("kernel")

    @property
    def wakes(self) -> list[float]:
        """Each round's wake-ups of the event loop's thread per request, its idle ones taken out."""
        return self._net("main_runs", unit=1.0)

    @property
    def raw_cpu_us(self) -> list[float]:
        """Each round's leader CPU per request, every thread, idle CPU included (the profile's own basis)."""
        return self._raw("cpu")

    @property
    def raw_main_us(self) -> list[float]:
        return self._raw("main")

    @staticmethod
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")


def measured(
    member: Member, rate: float, seconds: float, seed: int, tick: Tick | None = None
) -> tuple[loadgen.Result, CpuSample]:
    """An open loop at ``rate`` on ``member``, with what the leader's counters moved by meanwhile."""
    before = cpu_sample(member.pid)
    got = asyncio.run(loadgen.open_loop(member.chat_url, PAYLOADS, member.headers(), rate, seconds, seed, tick))
    return got, cpu_sample(member.pid).since(before)


def on_off(
    members: dict[str, Member], rate: float, seconds: float, rounds: int, warm: float, tick: Tick
) -> dict[str, Rounds]:
    """Rounds interleaved over the configurations, the order turned each round so none always goes first."""
    out = {name: Rounds() for name in members}
    for member in members.values():  # warm each: connections, caches, the first budget period
        measured(member, rate, warm, seed=99)
    names = list(members)
    for n in range(rounds):
        turn = n % len(names)
        for name in names[turn:] + names[:turn]:
            before = {other: cpu_sample(m.pid) for other, m in members.items()}
            started = time.perf_counter()
            got = asyncio.run(
                loadgen.open_loop(members[name].chat_url, PAYLOADS, members[name].headers(), rate, seconds, seed=n)
            )
            elapsed = time.perf_counter() - started
            for other, member in members.items():
                spent = cpu_sample(member.pid).since(before[other])
                if other == name:
                    out[name].add(got, spent, elapsed)
                else:
                    out[other].idle(spent, elapsed)
            tick()
    return out


@dataclass
class Profiled:
    """One profiled pass: the attribution of its functions, the requests answered, /proc's CPU meanwhile."""

    attributed: Attributed
    answered: int
    errors: int
    cpu_s: float
    main_s: float


def profiled(member: Member, clock: str, requests: int, rate: float, scratch: Path, tick: Tick) -> Profiled:
    """``requests`` requests at ``rate`` with the leader's profiling window open, on ``clock``."""
    out = scratch / f"stages-{clock}.prof"
    member.request_file.write_text(json.dumps({"out": str(out), "clock": clock}))
    os.kill(member.pid, signal.SIGUSR1)
    time.sleep(0.5)  # the handler runs at the loop's next Python step; heartbeats make one within this
    got, spent = measured(member, rate, requests / rate, seed=7, tick=tick)
    os.kill(member.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 60
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the leader wrote no profile to {out}")
        time.sleep(0.1)
    stats = pstats.Stats(str(out))
    return Profiled(attribute(stats, resolve()), len(got.latencies), got.errors, spent.cpu, spent.main)


async def _timings(url: str, headers: dict[str, str], requests: int) -> tuple[list[float], list[float]]:
    opod, upstream = [], []
    async with aiohttp.ClientSession() as session:
        for body in itertools.islice(itertools.cycle(PAYLOADS), requests):
            async with session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                parts = dict(p.strip().split(";dur=") for p in answer.headers.get("Server-Timing", "").split(","))
                opod.append(float(parts["opod"]))
                upstream.append(float(parts["upstream"]))
    return opod, upstream


def server_timing(member: Member, requests: int) -> tuple[float, float]:
    """Median ``Server-Timing`` of sequential requests, ms: opod's own part, and the wait on the engine."""
    opod, upstream = asyncio.run(_timings(member.chat_url, member.headers(), requests))
    return statistics.median(opod), statistics.median(upstream)


def py_spy() -> str | None:
    """py-spy's path: beside this Python (a virtual environment), or on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Flame:
    config: str
    saturation_rps: float
    rate: float
    files: list[str]
    errors: int
    """Requests refused or failed, in the closed loop and while recording."""


def flame(member: Member, spy: str, seconds: float, saturation_s: float, out: Path, tick: Tick) -> Flame:
    """py-spy's flame graph (and a speedscope profile) of the leader at half its saturation."""
    capacity = asyncio.run(
        loadgen.closed_loop(member.chat_url, PAYLOADS, member.headers(), CLIENTS, saturation_s, warmup=0.5)
    )
    rate = capacity.rps / 2
    name = member.config.name
    files = [f"stages-{name}.svg", f"stages-{name}.speedscope.json"]
    recorders = [
        subprocess.Popen(
            [spy, "record", "--pid", str(member.pid), "--duration", str(max(1, round(seconds))), "--nonblocking"]
            + ["--format", kind, "--output", str(out / file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind, file in zip(("flamegraph", "speedscope"), files, strict=True)
    ]
    try:
        got = asyncio.run(
            loadgen.open_loop(member.chat_url, PAYLOADS, member.headers(), rate, seconds + 1.0, tick=tick)
        )
        for recorder in recorders:
            _, said = recorder.communicate(timeout=60)
            if recorder.returncode != 0:
                raise RuntimeError(f"py-spy failed: {said.strip()[-400:]}")
    finally:
        for recorder in recorders:
            if recorder.poll() is None:
                recorder.kill()
                recorder.wait()
    return Flame(name, capacity.rps, rate, files, capacity.errors + got.errors)
