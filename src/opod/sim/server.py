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
from opod.http.serving import settle_memory
from opod.sim.app import build_app
from opod.sim.config import SimConfig, SimConfigError
from opod.sim.state import SimState

__all__ = ["SimHandle", "bind", "running", "serve"]


def bind(host: str, port: int) -> socket.socket:
    """A bound, not yet listening, TCP socket; a clear error when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise SimConfigError(f"--host/--port: cannot listen on {host}:{port} ({err.strerror}); pick another port, or 0 for any free one") from None
    sock.set_inheritable(True)
    return sock


HOT_PATHS = ("/v1/chat/completions", "/v1/completions")
"""The generation routes take the short way through the server (``opod.http.fastpath``), as a worker's data path does."""


def _uvicorn(app: Starlette) -> uvicorn.Server:
    hot = {("POST", route.path): route.endpoint for route in app.routes
           if isinstance(route, Route) and route.path in HOT_PATHS and "POST" in (route.methods or ())}
    config = uvicorn.Config(FastPath(hot, app), loop="none", http=FastHttpProtocol, lifespan="on", log_level="warning",
                            access_log=False, timeout_keep_alive=30, proxy_headers=False)
    return uvicorn.Server(config)


async def _serve(server: uvicorn.Server, state: SimState, sock: socket.socket) -> None:
    cfg = state.cfg
    if cfg.dialect == "vllm" and cfg.load_ms:
        await asyncio.sleep(cfg.load_ms / 1000.0)
        state.loaded_before_listen = True
    await server.serve(sockets=[sock])


def banner(cfg: SimConfig, host: str, port: int) -> str:
    models = ", ".join(cfg.models)
    events = ", KV events " + " and ".join(e for e in (cfg.kv_events, cfg.kv_events_bind) if e) if cfg.kv_events or cfg.kv_events_bind else ""
    return f"opod sim: listening on http://{host}:{port} (dialect {cfg.dialect}, model {models}, seed {cfg.seed}{events})"


def serve(config: SimConfig, announce: Callable[[str], None] | None = print) -> None:
    """Run a simulator in the foreground until interrupted; ``announce`` gets the one-line banner."""
    config.validate()
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    app = build_app(config)
    settle_memory()  # the simulated engine's timing is the product here: no collector pauses in it
    if announce is not None:
        announce(banner(config, config.host, port))
    uvloop.run(_serve(_uvicorn(app), app.state.sim, sock))


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
    config.validate()
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    app = build_app(config)
    server = _uvicorn(app)
    failure: list[BaseException] = []

    def target() -> None:
        try:
            uvloop.run(_serve(server, app.state.sim, sock))
        except BaseException as err:  # surfaced to the caller below
            failure.append(err)

    thread = threading.Thread(target=target, name=f"opod-sim-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout + config.load_ms / 1000.0
    while not server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"the simulator did not start: {failure[0] if failure else 'its thread ended'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the simulator on port {port} did not start within {start_timeout} s")
        time.sleep(0.005)
    host = f"[{config.host}]" if ":" in config.host else config.host
    try:
        yield SimHandle(f"http://{host}:{port}", port, app.state.sim)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
