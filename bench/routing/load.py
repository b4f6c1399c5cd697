"""The load generator: one process, one asyncio loop, one pooled aiohttp session per phase.

Bodies are serialized before a phase starts and streamed answers are read line
by line with byte checks (JSON is parsed only for the usage line), so the
generator spends as little of the shared CPUs as it can. Every request is
timed from the moment it was due (open loop) or sent (closed loop), so a
router that queues requests pays for the queueing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.loadgen import collector_paused, own_seconds
from opod.worker import processes

_TOKEN = re.compile(rb'"content":\s*"(?!")')
"""A chunk whose delta carries text (the opening role chunk has an empty or null content)."""


@dataclass(frozen=True)
class Target:
    """Where a path sends its requests: one router, or (direct) the engines in turn."""

    name: str
    bases: tuple[str, ...]
    headers: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    """The router's process, started in a process group of its own (its CPU time is read around the goals'
    phase); None for direct."""

    def url(self, i: int) -> str:
        return self.bases[i % len(self.bases)] + "/v1/chat/completions"


def cpu_seconds(pgid: int) -> float:
    """CPU time (user and system) spent so far by a router's process group: its process and the ones it started."""
    return sum(processes.cpu_seconds(pid) for pid in processes.group_members(pgid))


def cpu_wait_seconds(pgid: int) -> float:
    """Time the threads of a router's process group have spent so far ready to run but waiting for a core (the
    kernel's run-queue delay, the second figure of ``/proc/PID/task/TID/schedstat``); 0 where it cannot be read.

    On a machine whose cores the router shares with the engines and the load generator, this is the part of a
    request's added latency that is neither the router's own CPU nor the network: its turn for a core."""
    total = 0
    for pid in processes.group_members(pgid):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread gone in between, or a kernel without schedstat
    return total / 1e9


def cpu_by_process(pgid: int) -> dict[int, float]:
    """CPU seconds spent so far by each live process of a router's group."""
    return {pid: processes.cpu_seconds(pid) for pid in processes.group_members(pgid)}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the group spent between two readings: each process's own difference, so one that exited in
    between takes its time with it rather than making the difference negative."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


@dataclass
class Sample:
    due: float
    """perf_counter when the request was due (open loop) or sent (closed loop)."""
    done: float = 0.0
    ok: bool = False
    status: int = 0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    """Seconds between consecutive text chunks (streamed answers)."""
    tokens: int = 0
    error: str = ""
    own: float | None = None
    """Seconds the router says it spent on the request itself (opod's ``Server-Timing``); None when it does not say."""

    @property
    def latency(self) -> float:
        return self.done - self.due


@dataclass
class Phase:
    samples: list[Sample]
    seconds: float
    """The measured window (closed loop) or first due time to last completion (open loop)."""
    sent: int


KEEPALIVE_SECONDS = 3.0
"""Below the servers' own idle timeout (uvicorn's is 5 s), so the client never reuses a connection the server is closing."""


@contextlib.asynccontextmanager
async def _session(limit: int, timeout: float) -> AsyncIterator[aiohttp.ClientSession]:
    """The phase's pooled session; the generator's collector is paused meanwhile (``collector_paused``)."""
    with collector_paused():
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_SECONDS),
            timeout=aiohttp.ClientTimeout(total=timeout),
            skip_auto_headers=("User-Agent",),
            headers={"Content-Type": "application/json"},
        ) as session:
            yield session


async def _send(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], stream: bool, sample: Sample
) -> None:
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            sample.status = resp.status
            sample.own = own_seconds(resp.headers.get("Server-Timing"))
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return
            if not stream:
                data = await resp.read()
                sample.done = time.perf_counter()
                sample.ok = True
                usage = _usage(data)
                sample.tokens = usage or 0
                return
            last = 0.0
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                if _TOKEN.search(line):
                    now = time.perf_counter()
                    if sample.ttft is None:
                        sample.ttft = now - sample.due
                    else:
                        sample.gaps.append(now - last)
                    last = now
                    sample.tokens += 1
                elif b'"usage"' in line and b'"completion_tokens"' in line:
                    counted = _usage(line[5:])
                    if counted:
                        sample.tokens = counted
            sample.done = time.perf_counter()
            sample.ok = sample.ttft is not None
            if not sample.ok:
                sample.error = "stream ended without a token"
    except asyncio.CancelledError:
        sample.error = "unfinished when the phase ended"
        raise
    except TimeoutError:
        sample.error = "timed out"
    except aiohttp.ClientError as err:
        sample.error = f"{type(err).__name__}: {err}"[:200]


def _usage(data: bytes) -> int | None:
    if b'"completion_tokens"' not in data:
        return None
    try:
        usage = json.loads(data).get("usage") or {}
        return int(usage.get("completion_tokens") or 0) or None
    except (ValueError, TypeError, AttributeError):
        return None


async def closed_loop(
    target: Target,
    body: bytes | Sequence[bytes],
    concurrency: int,
    seconds: float,
    warmup: float = 0.5,
    timeout: float = 30.0,
    grace: float = 5.0,
    stream: bool = False,
    at_window: Callable[[], None] | None = None,
) -> Phase:
    """``concurrency`` clients back to back; counts what completes inside the measured window (``stream``: the body
    asks a streamed answer, read chunk by chunk for its time to first token). A list of bodies is sent in turn.
    ``at_window`` is called as the measured window opens and as it closes (to read what the router spent in it)."""
    bodies = [body] if isinstance(body, bytes) else list(body)
    samples: list[Sample] = []
    counter = iter(range(1 << 62))
    async with _session(concurrency, timeout) as session:
        begin = time.perf_counter()
        window = (begin + warmup, begin + warmup + seconds)
        if at_window is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(warmup, at_window)
            loop.call_later(warmup + seconds, at_window)

        async def client() -> None:
            while time.perf_counter() < window[1]:
                sample = Sample(time.perf_counter())
                n = next(counter)
                await _send(session, target.url(n), bodies[n % len(bodies)], target.headers, stream, sample)
                if not sample.ok:
                    sample.done = time.perf_counter()
                if window[0] <= sample.done <= window[1]:
                    samples.append(sample)
                if not sample.ok:
                    await asyncio.sleep(0.01)  # a refusing router must not turn the client into a busy loop

        tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
        _done, pending = await asyncio.wait(tasks, timeout=warmup + seconds + grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return Phase(samples, seconds, len(samples))


async def open_loop(
    target: Target,
    schedule: Sequence[tuple[float, bytes]],
    stream: bool,
    timeout: float = 60.0,
    drain: float = 30.0,
    tick: Callable[[], None] | None = None,
) -> Phase:
    """Send each body at its time (seconds from the start), whatever is still running; wait ``drain`` s at most after the last."""
    samples: list[Sample] = []
    tasks: list[asyncio.Task] = []
    async with _session(0, timeout) as session:
        start = time.perf_counter()

        async def one(i: int, body: bytes, sample: Sample) -> None:
            try:
                await _send(session, target.url(i), body, target.headers, stream, sample)
            finally:
                if not sample.done:
                    sample.done = time.perf_counter()
                if tick is not None:
                    tick()

        for i, (at, body) in enumerate(schedule):
            due = start + at
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sample = Sample(due)
            samples.append(sample)
            tasks.append(asyncio.create_task(one(i, body, sample)))
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    end = max((s.done for s in samples if s.ok), default=start)
    return Phase(samples, max(end - start, 1e-9), len(samples))


def merge(phases: Sequence[Phase]) -> Phase:
    """Several phases of one kind as one: their samples together, their windows added up."""
    return Phase([s for p in phases for s in p.samples], sum(p.seconds for p in phases), sum(p.sent for p in phases))


def probe(target: Target, body: bytes, timeout: float = 10.0) -> tuple[int, float]:
    """One request through the path, outside any phase: (HTTP status or 0, seconds)."""
    request = urllib.request.Request(
        target.url(0), data=body, method="POST", headers={"Content-Type": "application/json", **target.headers}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError:
        status = 0
    return status, time.perf_counter() - started
