"""The servers ``python -m bench plumbing`` sets side by side, each in a process of its own.

- ``bare-answer``: a bare httptools protocol on uvloop that answers every request with one fixed chat
  completion: the least a Python server can do per request. It is also the engine the relays call.
- ``opod-answer``: opod's own HTTP server (``opod.http.serving``: uvicorn with the short way of
  ``opod.http.fastpath``) with one hot route whose handler reads the request as the gateway's does
  (``headers_of``, ``read_whole``) and answers the same fixed completion (``PreparedResponse``).
- ``opod-relay``: the same server and handler, relaying the body to an engine through opod's own engine
  client (``opod.http.upstream.Upstreams``) and answering what it answered, as the gateway's relay does.

Governance, routing and records are left out on purpose: what is measured is the plumbing every
request passes through. ``bench/routing/floor.py`` is the bare relay beside ``opod-relay``.

Run: ``python -m bench.plumbing.servers MODE PORT [ENGINE_URL]``; it prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from bench.plumbing.protocols import JSON, PATH, BareAnswer, answer
from opod.http.fastpath import FastPath, PreparedResponse, headers_of, read_whole
from opod.http.serving import Listener, bind, serve, settle_memory
from opod.http.upstream import Upstreams, origin

MODES = ("bare-answer", "opod-answer", "opod-relay")


def relay_to(engine_url: str) -> object:
    upstreams = Upstreams()
    engine = origin(engine_url)

    async def relay(request: Request) -> Response:
        headers_of(request)
        body = read_whole(request) or b""
        answer = await upstreams.post(engine, PATH, body, b"Content-Type: application/json\r\n")
        data = answer.read_now()
        if data is None:
            data = await answer.read()
        return PreparedResponse(data, answer.status, JSON)

    return relay


async def _serve_opod(port: int, handler: object) -> None:
    app = FastPath({("POST", PATH): handler}, Starlette())  # type: ignore[dict-item]
    sock = bind("127.0.0.1", port, "bench plumbing")
    print("ready", flush=True)
    await serve([Listener(app, sock, "plumbing")], asyncio.Event())


async def _serve_bare(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(BareAnswer, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in MODES or not argv[1].isdigit() or (argv[0] == "opod-relay") != (len(argv) == 3):
        sys.exit(f"usage: python -m bench.plumbing.servers {{{'|'.join(MODES)}}} PORT [ENGINE_URL for opod-relay]")
    mode, port = argv[0], int(argv[1])
    settle_memory()
    if mode == "bare-answer":
        uvloop.run(_serve_bare(port))
    else:
        uvloop.run(_serve_opod(port, answer if mode == "opod-answer" else relay_to(argv[2])))


if __name__ == "__main__":
    main(sys.argv[1:])
