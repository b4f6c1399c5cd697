"""The open loop's pairing: at the goals' load each path runs in turns with direct, against real servers on loopback."""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from types import SimpleNamespace

from aiohttp import web

from bench.routing import runner, workloads
from bench.routing.load import Target
from bench.routing.runner import PathResult, Settings
from tests.bench.chat_server import serve_chat


class Servers:
    """Two tiny OpenAI-like servers in a thread of their own ("direct" and "path"), counting the requests each got."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.order: list[str] = []
        self.urls: dict[str, str] = {}
        self.runners: list[web.AppRunner] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        for name in ("direct", "path"):
            self.loop.run_until_complete(self._start(name))
        ready.set()
        self.loop.run_forever()

    async def _start(self, name: str) -> None:
        async def chat(request: web.Request) -> web.Response:
            await request.read()
            self.seen[name] += 1
            if not self.order or self.order[-1] != name:
                self.order.append(name)
            return web.json_response({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}})

        runner_, self.urls[name] = await serve_chat(chat)
        self.runners.append(runner_)

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner_ in self.runners:
                await runner_.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_at_the_goals_load_the_path_runs_in_turns_with_direct_and_is_compared_with_those_runs() -> None:
    servers = Servers()
    try:
        settings = Settings(loads=(0.25, 0.5), open_seconds=0.5, drain=5.0)
        offered = [20.0, 40.0]
        result = PathResult("opod", "opod", ran=True, sweep={})
        ticks: list[int] = []
        totals: list[int] = []

        def step(description: str, total: int):
            totals.append(total)
            return lambda: ticks.append(1)

        fleet = SimpleNamespace(engines=[servers.urls["direct"]])
        # The "router" is this process's group (the servers run in a thread here), so its CPU time is what the rounds cost.
        path = Target("opod", (servers.urls["path"],), pid=os.getpgrp())
        runner._open(result, path, fleet, settings, offered, step)  # type: ignore[arg-type]
    finally:
        servers.stop()
    low, goal = (len(workloads.poisson_arrivals(rate, 0.5, settings.seed + i)) for i, rate in enumerate(offered))
    assert servers.seen == {"path": low + runner.PAIRED_ROUNDS * goal, "direct": runner.PAIRED_ROUNDS * goal}
    assert servers.order == ["path"] + ["direct", "path"] * runner.PAIRED_ROUNDS  # the low load alone, then turns
    assert list(result.paired) == [40.0] and sorted(result.open) == [20.0, 40.0]
    assert result.open[40.0].ok == runner.PAIRED_ROUNDS * goal and result.paired[40.0].ok == runner.PAIRED_ROUNDS * goal
    assert totals == [len(ticks)]  # the progress bar ends full
    assert (
        0 < result.cpu_per_request < 0.5
    )  # measured over the path's rounds, per request sent (a bound for nonsense, not a goal)
