"""A thin ASGI dispatcher in front of a Starlette app, for the few routes on the hot path.

Starlette's middleware stack and route matching cost tens of microseconds per
request; the data path's routes are fixed paths, so a dictionary lookup finds
their handler and everything else goes to the full app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Awaitable[Response]]


class FastPath:
    def __init__(self, routes: Mapping[tuple[str, str], Handler], app) -> None:
        self.routes = dict(routes)
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get((scope["method"], scope["path"]))
            if handler is not None:
                response = await handler(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
