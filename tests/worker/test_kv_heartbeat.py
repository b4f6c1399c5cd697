"""The worker's engine manager runs the simulator under its supervisor and reports its blocks in heartbeats."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import aiohttp
import httpx
import pytest

from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.worker.agent import Agent
from opod.worker.engines import EngineManager
from opod.worker.supervisor import Supervisor
from tests.support.engine_manager import load_and_serve
from tests.worker.kv_support import BS, FILLER, LeaderView, chat, settle

# --- the worker: engine manager and heartbeat -------------------------------------------------------------


async def test_a_worker_reports_its_sim_engines_blocks_in_heartbeats(tmp_path: Path) -> None:
    supervisor = Supervisor()
    kicks: list[float] = []
    manager = EngineManager(
        engine_id="sim",
        home=tmp_path,
        catalog=load_catalog(),
        supervisor=supervisor,
        flags={"time_scale": 0},
        on_change=lambda: kicks.append(time.monotonic()),
    )
    agent = Agent(
        leader_url="http://127.0.0.1:9",
        node_id="n1",
        token="t",
        boot_id="b1",
        address="127.0.0.1:1",
        capabilities=nodeapi.Capabilities(),
        manager=manager,
    )
    view = LeaderView()
    try:
        body = (await agent.heartbeat_body()).to_wire()
        assert "kv_blocks" not in body  # nothing loaded: no engine reports yet
        engine = await load_and_serve(manager, "sim-model")
        assert engine.spec is not None and engine.spec.kv_events_endpoint.startswith("tcp://127.0.0.1:")
        assert engine.kv is not None
        await asyncio.sleep(0.5)

        async with httpx.AsyncClient(timeout=10) as client:
            tokens = await chat(client, engine.base_url, FILLER, "Through the worker?")
            assert manager.kv_report is not None
            await settle(manager.kv_report)
            kicked = len(kicks)
            body = await agent.heartbeat_body()
            kv = view.apply(body.kv_blocks)
            assert kv is not None and kv.stored == block_hashes(tokens, BS) and not kv.cleared
            assert kicked >= 1  # the changes asked for an early heartbeat

            # No leader answers at that address: the batch in that heartbeat may be lost, so the next starts over.
            with pytest.raises((aiohttp.ClientError, OSError)):
                await agent.beat()
            kv = manager.kv_blocks()
            assert kv is not None and kv.seq == view.seq + 2 and kv.cleared and kv.stored == block_hashes(tokens, BS)
            view.seq += 1  # (a leader would have seen the gap too, and the batch says cleared)
            view.apply(kv)

            # The supervisor relaunches a killed engine: its cache is empty, whatever was said before.
            process = supervisor.get(engine.process_id)
            assert process is not None and process.pid
            os.killpg(process.pid, signal.SIGKILL)
            for _ in range(400):
                await asyncio.sleep(0.05)
                if process.ready and process.restarts == 1:
                    break
            assert process.restarts == 1 and process.ready
            kv = view.apply((await agent.heartbeat_body()).kv_blocks)
            assert kv is not None and kv.cleared and not view.blocks

        port = int(engine.spec.kv_events_endpoint.rsplit(":", 1)[1])
        await manager.unload(nodeapi.UnloadModelRequest(id="sim-model"))
        assert engine.kv is None and manager.kv_report.sources == 0
        # Nothing left behind: the listener's task has ended and its port is free again.
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-events")]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        view.apply((await agent.heartbeat_body()).kv_blocks)
        assert "kv_blocks" not in (await agent.heartbeat_body()).to_wire()  # no engine reports any more
    finally:
        await manager.stop_all()
        await agent.close()


async def test_a_worker_whose_engine_publishes_nothing_never_sends_the_key(tmp_path: Path) -> None:
    manager = EngineManager(engine_id="llamacpp", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor())
    assert manager.kv_report is None and manager.kv_blocks() is None
    agent = Agent(
        leader_url="http://127.0.0.1:9",
        node_id="n1",
        token="t",
        boot_id="b1",
        address="127.0.0.1:1",
        capabilities=nodeapi.Capabilities(),
        manager=manager,
    )
    try:
        assert "kv_blocks" not in (await agent.heartbeat_body()).to_wire()
    finally:
        await manager.stop_all()
        await agent.close()
