"""The plumbing's Python in one process, warm and with the CPU's caches emptied before each request.

The servers of ``python -m bench plumbing`` run under load beside the load generator and each other, so a
request rarely finds the code and objects it touches still in the CPU's caches. Here the two protocols (the
bare one, and opod's server with its short way) are fed one request at a time in this process, with no
socket: a stand-in transport takes the answer. The two engine clients (a bare one, and opod's
``Upstreams`` as the relay reads an answer) send one request at a time to a stand-in transport that
answers it on the loop's next turn, as an engine on loopback would. Each is measured back to back (warm: the caches hold what
the last request touched) and with a buffer larger than the last-level cache written before each request
(cold: what it touches comes from memory). Set beside the servers' figures under load, the two show how
much of a request's cost is the amount of code and data it touches rather than the work it does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httptools
import uvloop
from starlette.applications import Starlette
from uvicorn.server import ServerState

from bench.plumbing.library_calls import LIBRARY_CALLS
from bench.plumbing.protocols import ANSWER, PATH, BareAnswer, answer
from opod.http.fastpath import FastHttpProtocol, FastPath
from opod.http.serving import server_config, settle_memory
from opod.http.upstream import Upstreams, _Connection, origin

BODY = b'{"model": "sim-chat", "messages": [{"role": "user", "content": "0: hello there"}], "max_tokens": 8}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: Python/3.11 aiohttp/3.9\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nAuthorization: Bearer sk-plumbing\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)

ENGINE_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(ANSWER),
    ANSWER,
)
"""What the stand-in engine answers each request the clients send."""
CALL_HEADERS = b"X-Request-Id: plumbing\r\nContent-Type: application/json\r\n"
"""The header lines the clients send, as opod's relay sends them to an engine on loopback."""

TURNS = 100
"""Turns of the event loop a request's answer may take here before the run stops as broken."""


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (Linux's sysfs), 32 MiB where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=32 << 20)


class Evictor:
    """Writes one byte of every cache line of a buffer twice the last-level cache: what was cached is gone."""

    def __init__(self) -> None:
        self.buffer = bytearray(2 * last_level_cache_bytes())
        self.zeros = bytes(len(self.buffer[::64]))

    def __call__(self) -> None:
        self.buffer[::64] = self.zeros


class Sink(asyncio.Transport):
    """A transport that keeps a count of what it was given, for a protocol with no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class InProcess:
    protocol: str
    warm_us: float
    cold_us: float


class BareAnswerInTask(BareAnswer):
    """:class:`BareAnswer` answering from a task of its own, as opod's server runs each hot request's handler."""

    def on_message_complete(self) -> None:
        asyncio.get_running_loop().create_task(self._answer())

    async def _answer(self) -> None:
        assert self.transport is not None
        self.transport.write(self.reply)


class Engine(Sink):
    """A transport for an engine client: each request written is answered on the loop's next turn."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol

    def write(self, data: Any) -> None:
        super().write(data)
        asyncio.get_running_loop().call_soon(self.protocol.data_received, ENGINE_ANSWER)


class BareClient(asyncio.Protocol):
    """A bare httptools engine client: one request at a time, its whole answer's bytes handed over at its end."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.received: list[bytes] = []
        self.answer: asyncio.Future[bytes] | None = None
        self.transport: asyncio.Transport = Engine(self)
        self.request = b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\n%bContent-Length: %d\r\n\r\n%b" % (
            PATH.encode(),
            CALL_HEADERS,
            len(BODY),
            BODY,
        )

    def data_received(self, data: bytes) -> None:
        self.received.append(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        data, self.received = b"".join(self.received), []
        assert self.answer is not None
        self.answer.set_result(data)

    async def call(self) -> bytes:
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        return await self.answer


class OpodClient:
    """opod's engine client (``Upstreams``) with one kept connection, read as the relay reads a whole answer."""

    def __init__(self) -> None:
        self.upstreams = Upstreams()
        self.origin = origin("http://127.0.0.1:8000")
        _, idle = self.upstreams._target(self.origin, PATH)
        connection = _Connection()
        connection.connection_made(Engine(connection))
        connection.home = idle
        idle.append(connection)

    async def call(self) -> bytes:
        answer = await self.upstreams.post(self.origin, PATH, BODY, CALL_HEADERS)
        data = answer.read_now()
        if data is None:
            data = await answer.read()
        _ = answer.content_type
        return data


def _connected(protocol: asyncio.Protocol) -> tuple[asyncio.Protocol, Sink]:
    sink = Sink()
    protocol.connection_made(sink)
    return protocol, sink


def _opod_server() -> asyncio.Protocol:
    """opod's server protocol as its listeners run it (``server_config``), with one hot route answering."""
    config = server_config(FastPath({("POST", PATH): answer}, Starlette()))
    config.load()
    return FastHttpProtocol(config=config, server_state=ServerState(), app_state={})


PROTOCOLS: dict[str, Callable[[], asyncio.Protocol]] = {
    "bare answer": BareAnswer,
    "bare answer, in a task": BareAnswerInTask,
    "opod answer": _opod_server,
}
"""The protocols measured, each made fresh for its run."""

CLIENTS: dict[str, Callable[[], BareClient | OpodClient]] = {"bare client": BareClient, "opod client": OpodClient}
"""The engine clients measured, each made fresh for its run."""


async def _per_request(protocol: asyncio.Protocol, sink: Sink, requests: int, evict: Evictor | None) -> float:
    """Microseconds from a request's bytes to its whole answer written, the median over ``requests``."""
    took = []
    for _ in range(requests):
        if evict is not None:
            evict()
        before = sink.written
        started = time.perf_counter()
        protocol.data_received(REQUEST)
        for _ in range(TURNS):  # opod's handler answers in a task: a turn of the loop or two
            if sink.written != before:
                break
            await asyncio.sleep(0)
        else:
            raise RuntimeError(f"no answer within {TURNS} turns of the loop: the protocol refused the request")
        took.append(time.perf_counter() - started)
    took.sort()
    return took[len(took) // 2] * 1e6


async def _per_call(client: BareClient | OpodClient, calls: int, evict: Evictor | None) -> float:
    """Microseconds from a call's start to its whole answer in hand, the median over ``calls``."""
    took = []
    for _ in range(calls):
        if evict is not None:
            evict()
        started = time.perf_counter()
        answered = await client.call()
        took.append(time.perf_counter() - started)
        if not answered.endswith(ANSWER):
            raise RuntimeError(f"the engine client handed over {answered[:80]!r}, not the engine's answer")
    took.sort()
    return took[len(took) // 2] * 1e6


def _per_library_call(call: Callable[[], object], calls: int, evict: Evictor | None) -> float:
    """Microseconds a library call takes, the median over ``calls``."""
    took = []
    for _ in range(calls):
        if evict is not None:
            evict()
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    took.sort()
    return took[len(took) // 2] * 1e6


async def _measure(warm: int, cold: int) -> list[InProcess]:
    evict = Evictor()
    out = []
    for name, make in PROTOCOLS.items():
        protocol, sink = _connected(make())
        await _per_request(protocol, sink, warm, None)  # the first requests make what later ones reuse
        out.append(
            InProcess(
                name,
                await _per_request(protocol, sink, warm, None),
                await _per_request(protocol, sink, cold, evict),
            )
        )
    for name, make_client in CLIENTS.items():
        client = make_client()
        await _per_call(client, warm, None)
        out.append(InProcess(name, await _per_call(client, warm, None), await _per_call(client, cold, evict)))
    for name, call in LIBRARY_CALLS.items():
        _per_library_call(call, warm, None)
        out.append(InProcess(name, _per_library_call(call, warm, None), _per_library_call(call, cold, evict)))
    return out


_RUN = "import sys; from bench.plumbing.in_process import main; main(sys.argv[1:])"
"""The measuring process's program (not ``-m``: the package imports this module before running it)."""


def measure(warm: int, cold: int) -> list[InProcess]:
    """Each protocol, ``warm`` requests back to back and ``cold`` after emptying the caches, in a fresh process whose
    memory is settled as a server's is (``settle_memory``), so the bench's own objects weigh on none of it."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(warm), str(cold)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the in-process measurement failed ({done.returncode}): {done.stderr[-2000:]}")
    return [InProcess(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]


def report(rows: list[InProcess], cold: int, under_load_gap: float, client_under_load: float) -> list[str]:
    by = {row.protocol: row for row in rows}
    bare, tasked, opod = by["bare answer"], by["bare answer, in a task"], by["opod answer"]
    bare_client, opod_client = by["bare client"], by["opod client"]
    warm_gap, cold_gap = opod.warm_us - bare.warm_us, opod.cold_us - bare.cold_us
    lines = [
        "## The same protocols and engine clients in one process, warm and cold",
        "",
        "Each protocol fed one request at a time with no socket (`bench/plumbing/in_process.py`); time from the "
        "request's bytes to its whole answer, the median. Each engine client calls a stand-in transport that "
        "answers on the loop's next turn; time from the call to its whole answer in hand (opod's as the relay "
        "reads a whole answer), the median. Warm: requests back to back. Cold: before each of "
        f"{cold} requests, a buffer twice the size of the last-level cache ({last_level_cache_bytes() >> 20} MiB) written, "
        f"so what the request touches comes from memory. {os.cpu_count()} CPUs. A cold figure moves with the memory's "
        "latency at the time (other work on the machine); the two protocols' ratio holds better than either.",
        "",
        "| protocol | warm µs/req | cold µs/req | cold / warm |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        if row.protocol not in LIBRARY_CALLS:
            lines.append(
                f"| {row.protocol} | {row.warm_us:.1f} | {row.cold_us:.1f} | {row.cold_us / row.warm_us:.1f} |"
            )
    lines += [
        "",
        f"- opod's server adds **{warm_gap:+.1f} µs** to a request warm and **{cold_gap:+.1f} µs** cold; under load, "
        f"in their own processes, the two servers were **{under_load_gap:+.0f} µs** of CPU apart (the table above).",
        f"- A task per request alone (the bare protocol answering from a task, and the loop's turn that runs it) adds "
        f"**{tasked.warm_us - bare.warm_us:+.1f} µs** warm and **{tasked.cold_us - bare.cold_us:+.1f} µs** cold.",
        f"- opod's engine client adds **{opod_client.warm_us - bare_client.warm_us:+.1f} µs** to a call warm and "
        f"**{opod_client.cold_us - bare_client.cold_us:+.1f} µs** cold over the bare client; under load its share "
        f"of the relays' gap was about **{client_under_load:+.0f} µs**.",
        "- A request's cost follows how much code and data it touches more than how many steps it takes: under load "
        "it runs mostly cold, so a cut that leaves the same code and objects in use saves little, and one that "
        "stops touching them saves several times its warm figure.",
        "",
        *library_report(by, cold),
    ]
    return lines


def library_report(by: dict[str, InProcess], cold: int) -> list[str]:
    """The library calls' table (:data:`LIBRARY_CALLS`): what a call into C costs a request that runs cold."""
    lines = [
        "## Library calls a request makes, warm and cold",
        "",
        f"Each call timed alone in the same process, warm (back to back) and cold (the caches emptied before each of "
        f"{cold}), the median; the first row is a call that does nothing, what timing a call costs by itself "
        "(`bench/plumbing/library_calls.py`).",
        "",
        "| call | warm µs | cold µs |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {by[name].warm_us:.2f} | {by[name].cold_us:.2f} |" for name in LIBRARY_CALLS]
    names = list(LIBRARY_CALLS)
    pairs = [(b, a) for b, a in zip(names, names[1:]) if b.startswith("before: ") and a.startswith("now: ")]
    lines.append("")
    for before, after in pairs:
        saved, warm = by[before].cold_us - by[after].cold_us, by[before].warm_us - by[after].warm_us
        lines.append(
            f"- {after.removeprefix('now: ')}, in place of {before.removeprefix('before: ')}: "
            f"**{saved:.2f} µs** less cold, {warm:.2f} warm."
        )
    lines.append("")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not all(arg.isdigit() and int(arg) > 0 for arg in argv):
        sys.exit("usage: main([WARM_REQUESTS, COLD_REQUESTS])")
    settle_memory()
    for row in uvloop.run(_measure(int(argv[0]), int(argv[1]))):
        print(json.dumps(asdict(row)), flush=True)
