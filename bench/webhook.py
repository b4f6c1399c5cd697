"""``python -m bench.webhook PORT``: the benchmarks' guardrail webhook, which allows every request and answer.

It answers ``POST /<anything>`` with ``{"action": "allow"}`` (opod's guardrail wire,
``opod.gateway.guardrails``) and ``GET /health`` with ``ok``, and prints ``ready`` once it listens.
It runs in a process of its own, so its CPU is neither the leader's nor the load generator's. It is
as small as an HTTP/1.1 server can be in Python (uvloop and httptools, kept connections, nothing
else), so that what a run measures is opod's call of a guardrail, not a web framework's handling
of it: a real check's own cost is the operator's, and is not guessed at.
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import uvloop

ALLOW = b'{"action":"allow"}'
_ANSWERS = {
    b"POST": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(ALLOW), ALLOW),
    b"GET": b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok",
}
_UNKNOWN = b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"


class Judge(asyncio.Protocol):
    """One client connection: every request on it is answered once its body has arrived."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        if self.transport is not None:
            self.transport.write(_ANSWERS.get(self.parser.get_method(), _UNKNOWN))


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Judge, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    try:
        uvloop.run(serve(int(sys.argv[1])))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
