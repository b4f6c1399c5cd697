"""Driving a worker's engine manager in-process: load a model and wait until its engine serves."""

from __future__ import annotations

import asyncio

from opod.contract import nodeapi
from opod.worker.engines import EngineManager
from opod.worker.model_engine import ModelEngine


async def load_and_serve(
    manager: EngineManager, model_id: str, timeout: float = 15.0, adapters: list[nodeapi.Adapter] | None = None
) -> ModelEngine:
    """Load ``model_id`` (with its definition's ``adapters``, as a leader sends them) and wait for its engine to
    serve; fails with the engine's own detail otherwise."""
    await manager.load(nodeapi.LoadModelRequest(id=model_id, adapters=adapters))
    engine = manager.engines[model_id]
    for _ in range(int(timeout / 0.05)):
        if engine.state in ("serving", "failed"):
            break
        await asyncio.sleep(0.05)
    assert engine.state == "serving", engine.detail
    return engine
