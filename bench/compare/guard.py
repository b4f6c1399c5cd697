"""The guardrail webhook of the compare benchmark's governed opod: it allows every request.

``python bench/compare/guard.py PORT`` serves ``POST /{guardrail id}`` (opod's guardrail wire,
``opod.gateway.guardrails``) answering ``{"action": "allow"}``, and ``GET /health``. It runs in a
process of its own, so its CPU is read apart from the leader's and the load generator's, and a
real check's own cost is not guessed at: what is measured is opod's call of it.
"""

from __future__ import annotations

import sys

import uvloop
from aiohttp import web

ALLOW = b'{"action":"allow"}'


async def judge(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ALLOW, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    app = web.Application()
    app.router.add_post("/{name}", judge)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
