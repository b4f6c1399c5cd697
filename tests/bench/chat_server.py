"""A tiny OpenAI-like chat server on loopback for the bench's own tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_chat(handler: Handler) -> tuple[web.AppRunner, str]:
    """Serve ``handler`` at ``POST /v1/chat/completions`` on a free loopback port: (runner to clean up, base URL)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
