"""opod's listeners' server: asleep between requests, stopped at once from any thread."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from opod.http.serving import QuietServer, bind, server_config


class CountedTicks(QuietServer):
    """A listener's server that counts the main loop's ticks (uvicorn's ``on_tick``): how often it wakes unasked."""

    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


def app() -> Starlette:
    return Starlette(routes=[Route("/", lambda request: PlainTextResponse("hello"))])


async def serve_for(server: QuietServer, seconds: float) -> tuple[asyncio.Task[None], float]:
    sock = bind("127.0.0.1", 0, "a test server")
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task.exception()
        await asyncio.sleep(0.01)
    await asyncio.sleep(seconds)
    return task, time.monotonic()


async def test_a_listener_sleeps_between_requests_and_stops_at_once_when_told_from_another_thread() -> None:
    server = CountedTicks(server_config(app()))
    task, _ = await serve_for(server, 0.6)
    assert server.ticks <= 1  # uvicorn's own loop would have woken about six times by now
    told = time.monotonic()
    threading.Thread(target=setattr, args=(server, "should_exit", True)).start()
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - told < 0.5


async def test_a_server_that_keeps_a_date_header_keeps_uvicorns_ticks() -> None:
    config = uvicorn.Config(app(), lifespan="off", loop="none", log_level="warning", date_header=True)
    server = CountedTicks(config)
    task, _ = await serve_for(server, 0.6)
    assert server.ticks >= 4  # the Date header is renewed each second by uvicorn's tick
    server.should_exit = True
    await asyncio.wait_for(task, 5)
