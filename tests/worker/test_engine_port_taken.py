"""An engine's port taken between the worker's choice and the engine's bind (another program's connection drew it
as its source port): the worker picks another port and the engine serves, rather than crash-looping on the taken one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.catalog import load_catalog
from opod.worker import engines as worker_engines
from opod.worker.engines import EngineManager
from opod.worker.model_engine import free_port
from opod.worker.supervisor import Supervisor
from tests.support.engine_manager import load_and_serve


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port held as a client's source port is: bound, not listening."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


async def test_an_engine_whose_port_was_taken_serves_on_another(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = iter([taken_port])
    monkeypatch.setattr(worker_engines, "free_port", lambda: next(draws, None) or free_port())
    manager = EngineManager(
        engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor(), flags={"time_scale": 0}
    )
    try:
        engine = await load_and_serve(manager, "sim-a", timeout=20.0)
        assert engine.port != taken_port
        process = manager.supervisor.get(engine.process_id)
        assert process is not None and process.restarts == 0, "a new process on a new port, not a restart on the old"
    finally:
        await manager.stop_all()
