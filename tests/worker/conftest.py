"""The KV-event tests' fixtures: simulators started as child processes, and listeners closed after each test."""

from __future__ import annotations

from typing import Any

import pytest

from opod.worker.kvevents import KVReport
from opod.worker.kvlistener import KVEventListener
from tests.worker.kv_support import Sim, start_sim


@pytest.fixture
async def sims() -> Any:
    started: list[Sim] = []

    async def start(*args: str) -> Sim:
        sim = await start_sim(*args)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        await sim.kill()
        await sim.client.aclose()


@pytest.fixture
async def listeners() -> Any:
    """``listen(report, **kw)`` starts a listener; all are closed at the end, and must release their blocks."""
    opened: list[KVEventListener] = []

    def listen(report: KVReport, **kw: Any) -> KVEventListener:
        listener = KVEventListener(report, name="sim-model", **kw)
        listener.start()
        opened.append(listener)
        return listener

    yield listen
    for listener in opened:
        await listener.close()
    for listener in opened:
        assert listener.report.sources == 0 and not listener.report.held
        listener.report.close()
