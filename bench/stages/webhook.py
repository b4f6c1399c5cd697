"""``python -m bench.stages.webhook PORT``: a guardrail webhook that allows every request and answer.

It runs in a process of its own, so its work is neither the leader's CPU nor the load generator's.
"""

from __future__ import annotations

import sys

from aiohttp import web

ALLOW = b'{"action": "allow"}'


async def judge(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ALLOW, content_type="application/json")


def main() -> None:
    app = web.Application()
    app.router.add_post("/{phase}", judge)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=lambda *_: None)


if __name__ == "__main__":
    main()
