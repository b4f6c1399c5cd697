"""A leader built in the test's own process: what tests of the management API talk to.

:class:`InProcessLeader` opens a leader with :meth:`opod.leader.leader.Leader.open` and runs its
lifespan (:meth:`Leader.run`) on an event loop of its own thread, so the reconciler, the followers
and the ledger run as they do under ``opod up``. The public listener serves on a loopback port, so
``opod join`` workers register with it and ``/v1`` answers real HTTP; the admin listener does too,
for the ``opod`` command (a subprocess, being what is tested there). Calls of the management API
itself go over an ASGI transport into the admin app on the leader's loop: the listener's checks
all run, without a socket or a process to start.

It offers what ``tests.support.opod_process.Leader`` offers to these tests (``url``, ``admin_url``,
``key``, ``home``, :meth:`admin`, :meth:`node_token`, :meth:`served`, :meth:`wait_served`,
:meth:`cli_env`), so helpers such as ``sim_worker`` and ``opod_cli`` take either.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from opod.http.serving import Listener, bind
from opod.leader.leader import Leader, LeaderSettings
from tests.support.opod_process import clean_env, http, wait_until
from tests.support.ports import free_port

T = TypeVar("T")


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` while the block runs (opod reads its ``OPOD_*`` settings from it)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class InProcessLeader:
    """``opod up --no-worker`` in this process; :meth:`stop` ends it as Ctrl-C would."""

    def __init__(
        self,
        home: Path,
        *,
        default_models: bool = False,
        env: Mapping[str, str] | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        """``env``: ``OPOD_*`` settings in force while it runs (``OPOD_DATABASE_URL`` names its store);
        ``ports`` = (public, admin) to come back on the same addresses after a restart."""
        self.home = home
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port, self.admin_port = ports or (free_port(), free_port())
        self._env = dict(env or {})
        self._restore = environment(self._env)
        self._restore.__enter__()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"leader {home.name}", daemon=True)
        self._thread.start()
        try:
            settings = LeaderSettings(
                home=home, database_url=self._env.get("OPOD_DATABASE_URL"), default_models=default_models
            )
            self.leader: Leader = self.call(asyncio.to_thread(Leader.open, settings))
            self.key = (home / "admin.key").read_text().strip()
            self._stop = self.call(self._start())
        except BaseException:
            self._end_loop()
            raise

    # --- running on the leader's loop -------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the leader's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> asyncio.Event:
        leader = self.leader
        listeners = [
            Listener(leader.public_app(), bind("127.0.0.1", self.port, "the leader"), "public"),
            Listener(leader.admin_app(), bind("127.0.0.1", self.admin_port, "the admin listener"), "admin"),
        ]
        self._admin = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=leader.admin_app()), base_url=f"http://127.0.0.1:{self.admin_port}"
        )
        stop = asyncio.Event()
        self._running = asyncio.create_task(leader.run(listeners, stop))
        for _ in range(200):  # the listeners are bound already; serving starts within a few turns of the loop
            if self._public_up():
                break
            await asyncio.sleep(0.01)
        return stop

    def _public_up(self) -> bool:
        import socket

        with socket.socket() as probe:
            probe.settimeout(0.2)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    # --- what tests call ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        key: str | None = "",
    ) -> httpx.Response:
        """One call of the admin app: ``body`` sent as JSON (``content`` as it is); the admin key unless ``key``
        names another (``None`` sends none)."""
        sent = {"Content-Type": "application/json"} if method not in ("GET", "HEAD") else {}
        token = self.key if key == "" else key
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        sent.update(headers or {})
        if content is None and body is not None:
            content = json.dumps(body).encode()
        return self.call(self._admin.request(method, path, content=content, headers=sent))

    def admin(
        self, method: str, path: str, body: object | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        """``(status, parsed JSON body)`` of a call with the admin key."""
        response = self.request(method, path, body, headers=headers)
        try:
            parsed = response.json() if response.content else None
        except ValueError:
            parsed = response.text
        return response.status_code, parsed

    def node_token(self) -> str:
        status, body = self.admin("POST", "/api/v1/node-tokens", {"name": "test"})
        assert status == 201, body
        return str(body["secret"])

    def served(self) -> set[str]:
        status, _, body = http("GET", self.url + "/v1/models", key=self.key)
        return {m["id"] for m in body["data"]} if status == 200 and isinstance(body, dict) else set()

    def wait_served(self, *models: str, timeout: float = 90.0) -> None:
        wait_until(lambda: set(models) <= self.served(), timeout, f"{models} to be served")

    def cli_env(self) -> dict[str, str]:
        """The environment of an ``opod`` command run against this leader."""
        return clean_env(self.home, OPOD_ADMIN_URL=self.admin_url)

    def stop(self) -> None:
        """Stop as Ctrl-C does: no new requests, the lifespan's order, the store closed."""
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.call(self._finish(), timeout=60)
        finally:
            self._end_loop()

    async def _finish(self) -> None:
        await self._running
        await self._admin.aclose()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
        self._restore.__exit__(None, None, None)
