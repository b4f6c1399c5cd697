"""A part of a page streamed while the work it shows runs: its block again at each change, as server-sent events.

The page's element names the stream (``data-stream``) and the event it listens for
(``data-stream-event``); the console's script swaps the element's content with each event's HTML and
closes the stream at the ``end`` event, sent once the work has ended, after its last look. A leader
keeps nothing of a stream past its request, so a page reopened on another leader streams from there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import StreamingResponse

END = "end"
"""The event that tells the page the work ended: nothing more will change."""
EVERY = 0.5
"""Seconds between two looks at the work (a fetch's bytes move at most twice a second)."""
FOR = 600.0
"""Seconds a stream stays open; the browser opens it again by itself."""

Look = Callable[[], Awaitable[tuple[Mapping[str, Any], bool]]]
"""The block's values now, and whether the work has ended."""


def event(name: str, html: str) -> str:
    return f"event: {name}\n" + "".join(f"data: {line}\n" for line in html.splitlines() or [""]) + "\n"


def stream_block(
    request: Request,
    templates: Environment,
    template: str,
    block: str,
    look: Look,
    *,
    name: str,
    every: float = EVERY,
) -> StreamingResponse:
    """``template``'s ``block`` as event ``name`` each time it changes, until the work ends or the page closes."""
    render = templates.get_template(template)

    async def events() -> AsyncIterator[str]:
        last = ""
        ends = time.monotonic() + FOR
        yield "retry: 2000\n\n"
        while time.monotonic() < ends and not await request.is_disconnected():
            values, ended = await look()
            html = "".join(render.blocks[block](render.new_context(dict(values))))
            if html != last:
                last = html
                yield event(name, html)
            if ended:
                yield event(END, "")
                return
            await asyncio.sleep(every)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
