"""A worker stopping while its heartbeat is cut off says nothing alarming and stops at once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp import web

from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.worker.agent import Agent
from opod.worker.engines import EngineManager
from opod.worker.supervisor import Supervisor


async def test_a_heartbeat_cut_off_by_the_stop_is_not_reported_as_an_unreachable_leader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    heartbeats = 0

    async def register(request: web.Request) -> web.Response:
        return web.json_response({"status": "registered", "id": "n1"})

    async def heartbeat(request: web.Request) -> web.StreamResponse:
        nonlocal heartbeats
        heartbeats += 1
        stop.set()  # as `opod up` stopping its leader and worker together
        assert request.transport is not None
        request.transport.close()  # the leader's listener closes with the heartbeat in flight
        return web.Response()

    app = web.Application()
    app.router.add_post(nodeapi.PATH_REGISTER, register)
    app.router.add_post(nodeapi.PATH_HEARTBEAT, heartbeat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    manager = EngineManager(engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor())
    agent = Agent(
        leader_url=f"http://127.0.0.1:{port}",
        node_id="n1",
        token="t",
        boot_id="b1",
        address="127.0.0.1:1",
        capabilities=nodeapi.Capabilities(),
        manager=manager,
    )
    try:
        with caplog.at_level(logging.INFO, logger="opod.worker"):
            await asyncio.wait_for(agent.run(stop), timeout=5)
    finally:
        await agent.close()
        await runner.cleanup()
    assert heartbeats == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
