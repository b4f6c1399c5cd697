"""Load generators: closed loop (N clients back to back) and open loop (Poisson arrivals at a fixed rate).

Latency is measured per request from the moment it is due (open loop) or sent
(closed loop) to the last byte, with one pooled aiohttp session, so two targets
measured the same way compare fairly. The body is one for every request, or a list the requests take in
turn (chats that each open with their own number, which no router can place by a prefix seen before).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp

OWN_TIME = re.compile(r"(?:^|,)\s*opod;dur=([0-9.]+)")
"""opod's own share of an answer's time in its ``Server-Timing`` header (milliseconds): from the request's arrival
to the answer's headers, the wait on the engine left out."""


def own_seconds(timing: str | None) -> float | None:
    """The seconds an answer's ``Server-Timing`` header says opod spent on it; ``None`` when it does not say."""
    found = OWN_TIME.search(timing) if timing else None
    return float(found.group(1)) / 1000 if found else None


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    """Each answer's own time as opod's ``Server-Timing`` says (seconds); empty for a router that does not say."""
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    elapsed: float = 0.0
    tokens: int = 0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        return percentile(self.latencies, q)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (nearest rank); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The load generator's garbage collector off while it measures.

    A full collection of the generator's heap stalls every request in flight for 10 to 30 ms, in
    whichever path's window it falls. On the routing bench the direct path's own p99 ranged from
    233 to 261 ms over 5-second windows with it running, and from 230 to 239 ms with it paused
    (and the simulators' start-up objects frozen). The requests' objects die by reference
    counting; the few cycles wait for the collection after the window. The bench process
    freezes nothing else, so unfreezing afterwards is safe.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


@contextlib.asynccontextmanager
async def _session(limit: int) -> AsyncIterator[aiohttp.ClientSession]:
    with collector_paused():
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60), timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            yield session


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict, result: Result, started: float
) -> None:
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            data = await resp.read()
            result.statuses[resp.status] = result.statuses.get(resp.status, 0) + 1
            if resp.status != 200:
                result.errors += 1
                return
            own = own_seconds(resp.headers.get("Server-Timing"))
            if own is not None:
                result.own.append(own)
            if b'"completion_tokens"' in data:
                try:
                    result.tokens += json.loads(data)["usage"]["completion_tokens"]
                except (ValueError, KeyError, TypeError):
                    pass
    except (TimeoutError, aiohttp.ClientError):
        result.errors += 1
        return
    result.latencies.append(time.perf_counter() - started)


Body = bytes | Sequence[bytes]
"""One body for every request, or bodies the requests take in turn."""


def _turns(body: Body) -> Iterator[bytes]:
    return itertools.repeat(body) if isinstance(body, bytes) else itertools.cycle(body)


async def closed_loop(
    url: str, body: Body, headers: dict, concurrency: int, seconds: float, warmup: float = 1.0
) -> Result:
    result = Result()
    bodies = _turns(body)
    async with _session(concurrency) as session:
        stop_at = time.perf_counter() + warmup + seconds
        measure_from = time.perf_counter() + warmup

        async def client() -> None:
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                sink = result if started >= measure_from else Result()
                await _one(session, url, next(bodies), headers, sink, started)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.elapsed = seconds
    return result


async def open_loop(
    url: str,
    body: Body,
    headers: dict,
    rate: float,
    seconds: float,
    seed: int = 0,
    tick: Callable[[], None] | None = None,
) -> Result:
    result = Result()
    rng = random.Random(seed)
    bodies = _turns(body)
    async with _session(0) as session:
        tasks = []
        start = time.perf_counter()
        due = start
        while due - start < seconds:
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, next(bodies), headers, result, due)))
            if tick is not None:
                tick()
        await asyncio.gather(*tasks)
        result.elapsed = time.perf_counter() - start
    return result


async def stream_tokens(url: str, body: dict, headers: dict, runs: int) -> tuple[int, float]:
    """Sequential streamed requests: total completion tokens and seconds spent generating them."""
    total_tokens, total_time = 0, 0.0
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    async with _session(4) as session:
        for _ in range(runs):
            started = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            total_tokens += usage["completion_tokens"]
            total_time += time.perf_counter() - started
    return total_tokens, total_time
