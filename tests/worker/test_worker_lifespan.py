"""A worker's one lifespan: it serves its port while it runs, says goodbye when stopped, then closes the port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from opod.contract import nodeapi
from opod.http.serving import ListenError
from opod.worker.run import WorkerSettings, open_worker


class Leader:
    """The leader's side of the node protocol, keeping what it was told."""

    def __init__(self) -> None:
        self.registered = asyncio.Event()
        self.heartbeats: list[nodeapi.Heartbeat] = []

    async def register(self, request: web.Request) -> web.Response:
        self.registered.set()
        return web.json_response({"status": "registered", "id": "n1"})

    async def heartbeat(self, request: web.Request) -> web.Response:
        self.heartbeats.append(nodeapi.Heartbeat.from_wire(await request.read()))
        return web.json_response({"status": "ok"})


@pytest.fixture
async def leader() -> AsyncIterator[tuple[Leader, str]]:
    state = Leader()
    app = web.Application()
    app.router.add_post(nodeapi.PATH_REGISTER, state.register)
    app.router.add_post(nodeapi.PATH_HEARTBEAT, state.heartbeat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield state, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def settings(home: Path, leader_url: str, port: int = 0) -> WorkerSettings:
    return WorkerSettings(
        leader_url=leader_url, token="t", home=home, listen=("127.0.0.1", port), engine="sim", node_id="n1"
    )


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_worker_serves_while_it_runs_and_closes_its_port_after_saying_goodbye(
    tmp_path: Path, leader: tuple[Leader, str]
) -> None:
    state, url = leader
    worker = open_worker(settings(tmp_path, url))
    port = worker.listener.port
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(state.registered.wait(), timeout=10)
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/healthz") as answer:
        assert answer.status == 200
    stop.set()
    await asyncio.wait_for(running, timeout=15)
    assert state.heartbeats[-1].engine is not None and state.heartbeats[-1].engine.state == "stopped"
    assert refuses(port)
    said = len(state.heartbeats)
    await asyncio.wait_for(worker.stop(), timeout=1)  # a second stop has nothing left to do
    assert len(state.heartbeats) == said


async def test_a_worker_stopped_before_it_ran_releases_its_port(tmp_path: Path, leader: tuple[Leader, str]) -> None:
    state, url = leader
    worker = open_worker(settings(tmp_path, url))
    port = worker.listener.port
    await asyncio.wait_for(worker.stop(), timeout=10)
    assert refuses(port) and not state.heartbeats  # never registered: no goodbye either
    again = open_worker(settings(tmp_path, url, port))  # the port is free for the next one
    await again.stop()


async def test_a_worker_whose_port_is_taken_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=rf"the worker cannot listen on 127.0.0.1:{port}: the port is in use"):
            open_worker(settings(tmp_path, "http://127.0.0.1:9", port))
    assert not (tmp_path / "logs").exists()  # nothing was set up for engines
