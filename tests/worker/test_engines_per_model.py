"""The heartbeat says each model's engine apart: one engine killed is that model crashed and restarting, while
the worker's other model goes on serving and the worker's own engine word stays ``serving``."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.worker.agent import Agent
from opod.worker.engines import EngineManager
from opod.worker.supervisor import Supervisor
from tests.support.engine_manager import load_and_serve


async def test_a_killed_engine_is_its_model_restarting_and_the_other_model_still_serves(tmp_path: Path) -> None:
    kicks: list[int] = []
    supervisor = Supervisor(on_change=lambda _process: kicks.append(1))
    manager = EngineManager(
        engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=supervisor, flags={"time_scale": 0}
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
    try:
        await load_and_serve(manager, "sim-a")
        await load_and_serve(manager, "sim-b")
        body = await agent.heartbeat_body()
        assert body.model_engines is not None and {m: e.state for m, e in body.model_engines.items()} == {
            "sim-a": "serving",
            "sim-b": "serving",
        }
        process = supervisor.get(manager.engines["sim-a"].process_id)
        assert process is not None and process.pid is not None
        kicks.clear()
        os.kill(process.pid, signal.SIGKILL)
        for _ in range(100):
            if not process.ready:
                break
            await asyncio.sleep(0.02)
        body = await agent.heartbeat_body()
        assert kicks, "the crash asks for an early heartbeat"
        assert body.loaded_models == ["sim-b"]
        assert body.engine is not None and body.engine.state == "serving", "the worker still serves its other model"
        assert body.model_engines is not None
        crashed = body.model_engines["sim-a"]
        assert crashed.state == "starting" and "SIGKILL" in crashed.detail, crashed
        for _ in range(300):
            if process.ready:
                break
            await asyncio.sleep(0.05)
        body = await agent.heartbeat_body()
        assert body.loaded_models == ["sim-a", "sim-b"]
        assert body.model_engines is not None and body.model_engines["sim-a"].state == "serving"
        assert body.model_engines["sim-a"].restarts == 1
    finally:
        await manager.stop_all()
        await agent.close()
