"""A bare Python relay: the yardstick for what one Python hop costs on the machine the bench runs on.

uvloop and httptools, round robin over the engines, kept connections, and nothing else: no key
check, no routing state, no accounting. The request's bytes go to the engine as received and the
answer's bytes come back as they arrive, so streamed answers stream. Set beside opod in the same
run, it shows how much latency any Python hop adds on this machine at that moment; both figures
carry the machine's noise, so read them side by side rather than subtract them. One request at a
time per client connection, as the bench's load generator sends them.

Run: ``python bench/routing/floor.py PORT ENGINE_URL...`` (it imports nothing from the bench);
it prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from urllib.parse import urlsplit

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    """One kept connection to an engine; while it answers, its bytes go straight to ``client``."""

    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: Downstream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self.client.transport.write(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        if self.client is not None:
            self.client.upstream = None
            self.client = None
        self.pool.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None:
            self.client.transport.close()


class Relay:
    def __init__(self, engines: list[tuple[str, int]]) -> None:
        self.engines = engines
        self.pools: list[list[Upstream]] = [[] for _ in engines]
        self.turn = itertools.cycle(range(len(engines)))

    def send(self, raw: bytes, client: Downstream) -> None:
        i = next(self.turn)
        pool = self.pools[i]
        if pool:
            self._attach(pool.pop(), raw, client)
        else:
            asyncio.get_running_loop().create_task(self._open(i, raw, client))

    async def _open(self, i: int, raw: bytes, client: Downstream) -> None:
        host, port = self.engines[i]
        try:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(self.pools[i]), host, port
            )
        except OSError:
            client.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            return
        self._attach(upstream, raw, client)

    @staticmethod
    def _attach(upstream: Upstream, raw: bytes, client: Downstream) -> None:
        upstream.client, client.upstream = client, upstream
        upstream.transport.write(raw)


class Downstream(asyncio.Protocol):
    """A client connection: each whole request is passed on as the bytes it came in."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.received: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        raw, self.received = b"".join(self.received), []
        self.relay.send(raw, self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            # The client left mid-answer: the rest of that answer has nowhere to go.
            self.upstream.client = None
            self.upstream.transport.close()


async def serve(port: int, engine_urls: list[str]) -> None:
    engines = [(parts.hostname or "127.0.0.1", parts.port or 80) for parts in map(urlsplit, engine_urls)]
    relay = Relay(engines)
    server = await asyncio.get_running_loop().create_server(lambda: Downstream(relay), "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python bench/routing/floor.py PORT ENGINE_URL...")
    uvloop.run(serve(int(argv[0]), argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
