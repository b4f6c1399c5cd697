"""Serving several ASGI apps in one event loop, with one place that handles signals.

uvicorn's own signal handling assumes one server per process; ``opod up`` runs
the public, admin and worker listeners together, so they share one stop event.
Sockets are bound before serving so a taken port is a clear error, not a log line.
A listener given an ``ssl`` context serves HTTPS, and its requests carry the
TLS peer in the ASGI scope (:mod:`opod.http.tls.protocol`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import socket
import ssl as ssl_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import uvicorn
from starlette.types import ASGIApp

from opod.http.fastpath import FastHttpProtocol
from opod.http.tls.protocol import TLSHttpToolsProtocol

YOUNG_COLLECTION_AT = 20_000
"""Allocations between two collections of the youngest generation (Python's default is 700).

Each request in flight holds a few hundred tracked objects (coroutines, futures, headers). At
the default the collector walks them over and over while they live: a leader with about a
hundred requests in flight spent 3 to 4 young collections a second, about 1 ms each and up to
13 ms, holding up every request in flight. A request's objects mostly die by reference counting
long before 20,000 allocations have passed. Measured on the routing bench's leader at 487 req/s:
collection time fell from about 6 ms to 0.3 ms per second of load."""


def settle_memory() -> None:
    """Before serving: what start-up built lives as long as the process, so it leaves the
    collector's passes (``gc.freeze``), and young collections come less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_AT, *gc.get_threshold()[1:])


class QuietServer(uvicorn.Server):
    """uvicorn's server with no signal handlers of its own (:func:`serve` has one stop for every listener), asleep
    until it is told to stop.

    uvicorn's main loop wakes ten times a second to look at ``should_exit``, renew its Date header and count requests
    against a limit: a timer, a task's step and a call each time, per listener. opod's listeners send no Date header
    and set no limit, so this loop sleeps until ``should_exit`` is set (from any thread, or a signal handler); a server
    configured with either keeps uvicorn's loop.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._wake_to_exit: Callable[[], object] | None = None
        """Wakes :meth:`main_loop` from any thread while it sleeps; ``None`` otherwise."""
        self._should_exit = False
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        wake = self._wake_to_exit
        if value and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: nothing left to wake
                wake()

    async def main_loop(self) -> None:
        config = self.config
        if config.date_header or config.callback_notify is not None or config.limit_max_requests is not None:
            await super().main_loop()
            return
        told = asyncio.Event()
        self._wake_to_exit = partial(asyncio.get_running_loop().call_soon_threadsafe, told.set)
        try:
            if not self._should_exit:  # read after the wake is in place: a stop set in between is seen either way
                await told.wait()
        finally:
            self._wake_to_exit = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ListenError(OSError):
    pass


def parse_listen(text: str, default_host: str, field: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``port`` → (host, port), with a clear error naming ``field``."""
    value = text.strip()
    host, _, port = value.rpartition(":") if ":" in value else ("", "", value)
    host = host.strip("[]") or default_host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{field}: {text!r} is not host:port (e.g. 0.0.0.0:8080)")
    return host, int(port)


def bind(host: str, port: int, what: str, *, option: str = "its --listen option", listen: bool = True) -> socket.socket:
    """A socket bound to ``host:port``, or a :class:`ListenError` naming ``what`` and the ``option`` that moves it.

    ``listen=False`` leaves it bound but not listening: connections are refused
    until the server starts on it, as a loading vLLM refuses them.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ListenError(
                f"{what} cannot listen on {host}:{port}: the port is in use (another opod?). Choose another with {option}."
            ) from None
        raise ListenError(f"{what} cannot listen on {host}:{port}: {err.strerror}") from None
    if listen:
        sock.listen(2048)
    sock.setblocking(False)
    return sock


@dataclass
class Listener:
    app: ASGIApp
    sock: socket.socket
    name: str
    ssl: ssl_module.SSLContext | None = None
    """HTTPS with this context (``opod.http.tls.LeaderTLS.context``); None = plain HTTP."""

    @property
    def scheme(self) -> str:
        return "https" if self.ssl is not None else "http"

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]


def server_config(app: ASGIApp, tls: bool = False) -> uvicorn.Config:
    """uvicorn's settings for one of opod's listeners: its HTTP protocol (the short way, or TLS's), no access log,
    lifespan, proxy headers, ``server`` or ``date`` header, and the event loop the caller runs."""
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http=TLSHttpToolsProtocol if tls else FastHttpProtocol,
        loop="none",
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )


async def serve(listeners: list[Listener], stop: asyncio.Event) -> None:
    """Serve every listener until ``stop`` is set, then shut them down gracefully."""
    servers = []
    for listener in listeners:
        config = server_config(listener.app, tls=listener.ssl is not None)
        if listener.ssl is not None:
            # uvicorn builds its own context from file names; opod's changes while serving.
            config.load()
            config.ssl = listener.ssl
        servers.append(QuietServer(config))
    tasks = [
        asyncio.create_task(server.serve(sockets=[listener.sock]))
        for server, listener in zip(servers, listeners, strict=True)
    ]
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()
