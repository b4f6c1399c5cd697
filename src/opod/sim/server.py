"""Serving a simulator with uvicorn (uvloop + httptools): in the foreground, or in a thread for tests.

The listening socket is bound before anything else, so port 0 works and the
real port is known at once. A vLLM-dialect simulator with ``--load-ms`` binds
but does not listen until the load is over: connections are refused, which is
what a real vLLM does while it loads. The other dialects listen at once and
answer health checks with their own "loading" reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.routing import Route

from opod.http.fastpath import FastHttpProtocol, FastPath
from opod.http.serving import ListenError, bind, settle_memory
from opod.sim.app import sim_app
from opod.sim.config import SimConfig, SimConfigError
from opod.sim.state import SimState

__all__ = ["SimHandle", "Simulator", "open_simulator", "running", "serve"]

HOT_PATHS = ("/v1/chat/completions", "/v1/completions")
"""The generation routes take the short way through the server (``opod.http.fastpath``), as a worker's data path does."""


def _uvicorn(app: Starlette) -> uvicorn.Server:
    hot = {
        ("POST", route.path): route.endpoint
        for route in app.routes
        if isinstance(route, Route) and route.path in HOT_PATHS and "POST" in (route.methods or ())
    }
    config = uvicorn.Config(
        FastPath(hot, app),
        loop="none",
        http=FastHttpProtocol,
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        proxy_headers=False,
    )
    return uvicorn.Server(config)


@dataclass(frozen=True, slots=True)
class Simulator:
    """One simulator, built complete by :func:`open_simulator`: its bound socket, its state and its server."""

    config: SimConfig
    sock: socket.socket
    state: SimState
    server: uvicorn.Server

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def banner(self) -> str:
        cfg = self.config
        models = ", ".join(cfg.models)
        events = (
            ", KV events " + " and ".join(e for e in (cfg.kv_events, cfg.kv_events_bind) if e)
            if cfg.kv_events or cfg.kv_events_bind
            else ""
        )
        return f"opod sim: listening on http://{cfg.host}:{self.port} (dialect {cfg.dialect}, model {models}, seed {cfg.seed}{events})"

    async def serve(self) -> None:
        """The simulator's lifespan: the load phase (before listening, for vLLM), then serve until told to exit."""
        if self.state.loads_before_listening:
            await asyncio.sleep(self.config.load_ms / 1000.0)
        await self.server.serve(sockets=[self.sock])


def open_simulator(config: SimConfig) -> Simulator:
    """The one place a simulator is built. The socket is bound first, so port 0 works and the real port is known at once."""
    config.validate()
    # A loading vLLM has nothing listening yet: connections are refused until the load is over.
    loads_first = config.dialect == "vllm" and config.load_ms > 0
    try:
        sock = bind(config.host, config.port, "opod sim", option="--port (0 picks a free one)", listen=not loads_first)
    except ListenError as err:
        raise SimConfigError(f"--host/--port: {err}") from None
    try:
        state = SimState(config, loads_before_listening=loads_first)
    except BaseException:
        sock.close()
        raise
    return Simulator(config, sock, state, _uvicorn(sim_app(state)))


def serve(config: SimConfig, announce: Callable[[str], None] | None = print) -> None:
    """Run a simulator in the foreground until interrupted; ``announce`` gets the one-line banner."""
    sim = open_simulator(config)
    settle_memory()  # the simulated engine's timing is the product here: no collector pauses in it
    if announce is not None:
        announce(sim.banner())
    uvloop.run(sim.serve())


@dataclass(frozen=True, slots=True)
class SimHandle:
    """A simulator running in a background thread."""

    url: str
    """``http://host:port``, without a trailing slash."""
    port: int
    state: SimState
    """The running simulator's state (read it; it belongs to the server's thread)."""


@contextlib.contextmanager
def running(config: SimConfig, start_timeout: float = 10.0) -> Iterator[SimHandle]:
    """Serve ``config`` in a thread for the duration of the ``with`` block (use port 0 for a free port).

    Crash faults end the whole process, so test them against ``opod sim`` run as a subprocess.
    """
    sim = open_simulator(config)
    failure: list[BaseException] = []

    def target() -> None:
        try:
            uvloop.run(sim.serve())
        except BaseException as err:  # surfaced to the caller below
            failure.append(err)

    thread = threading.Thread(target=target, name=f"opod-sim-{sim.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout + config.load_ms / 1000.0
    while not sim.server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"the simulator did not start: {failure[0] if failure else 'its thread ended'}")
        if time.monotonic() > deadline:
            sim.server.should_exit = True
            raise TimeoutError(f"the simulator on port {sim.port} did not start within {start_timeout} s")
        time.sleep(0.005)
    host = f"[{config.host}]" if ":" in config.host else config.host
    try:
        yield SimHandle(f"http://{host}:{sim.port}", sim.port, sim.state)
    finally:
        sim.server.should_exit = True
        thread.join(10)
        sim.sock.close()
