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

opod reads its environment when it opens (``opod.config``), so a leader's ``OPOD_*`` settings are in
``os.environ`` only while it opens, as ``opod up`` would see them (``OPOD_HOME`` its home, the test
process's own ``OPOD_*`` hidden): several leaders in one test process do not see each other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvloop

from bench.ports import free_port
from opod.leader.leader import Leader, LeaderSettings
from opod.leader.run import Up, UpSettings
from opod.worker.run import Worker, WorkerSettings
from tests.support.opod_process import NO_INSTALL, clean_env, http, wait_until

T = TypeVar("T")

INSTALL_COMMANDS = ("OPOD_UPGRADE_COMMAND", "OPOD_ENGINE_INSTALL_COMMAND")
"""A local worker reads these when asked to install something: while one runs, they install nothing (as
``clean_env`` has it for processes)."""


@contextmanager
def environment(values: Mapping[str, str], *, hide: tuple[str, ...] = ()) -> Iterator[None]:
    """``values`` in ``os.environ`` while the block runs, and the variables starting with one of ``hide`` out of it."""
    hidden = {name: value for name, value in os.environ.items() if name.startswith(hide)} if hide else {}
    before = {name: os.environ.get(name) for name in values}
    for name in hidden:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.environ.update(hidden)


class InProcessLeader:
    """``opod up`` in this process (``--no-worker`` unless ``worker`` names an engine); :meth:`stop` ends it as
    Ctrl-C would, and :meth:`restart` opens it again on the same home and addresses."""

    def __init__(
        self,
        home: Path,
        *,
        default_models: bool = False,
        env: Mapping[str, str] | None = None,
        ports: tuple[int, int] | None = None,
        worker: str | None = None,
        probe_port: int | None = None,
    ) -> None:
        """``env``: ``OPOD_*`` settings it opens with (``OPOD_DATABASE_URL`` names its store); ``ports`` = (public,
        admin) to come back on the same addresses after a restart; ``worker``: the engine of a local worker in
        this process, as ``opod up --engine`` runs one (its node id kept in ``home``); ``probe_port``: a listener of
        the probes alone there, as ``OPOD_PROBE_LISTEN`` asks of ``opod up``."""
        self.home = home
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port, self.admin_port = ports or (free_port(), free_port())
        self.default_models = default_models
        self.env = dict(env or {})
        self.engine = worker
        self.probe_port = probe_port
        self._installs: contextlib.AbstractContextManager[None] | None = None
        self.said: list[str] = []
        """What ``opod up`` would have said on its console."""
        self.loop = uvloop.new_event_loop()  # as opod up runs it (asyncio's own loop would leave Nagle on)
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"leader {home.name}", daemon=True)
        self._thread.start()
        try:
            with environment({"OPOD_HOME": str(home), **self.env}, hide=("OPOD_", "HF_")):
                self.up = Up(self._settings(), say=self.said.append)
                self.call(self.up.start())  # opens the leader, binds its listeners, opens the local worker
            self.leader: Leader = self.up.leader
            self.worker: Worker | None = self.up.worker
            self.key = (home / "admin.key").read_text().strip()
            self.call(self._serve())
            if worker is not None:
                self._installs = environment(dict.fromkeys(INSTALL_COMMANDS, NO_INSTALL))
                self._installs.__enter__()
        except BaseException:
            self._end_loop()
            raise

    def _settings(self) -> UpSettings:
        """``opod up``'s settings for this leader: its addresses on loopback, its local worker if any."""
        return UpSettings(
            leader=LeaderSettings(
                home=self.home, database_url=self.env.get("OPOD_DATABASE_URL"), default_models=self.default_models
            ),
            listen=("127.0.0.1", self.port),
            admin_listen=("127.0.0.1", self.admin_port),
            probe_listen=("127.0.0.1", self.probe_port) if self.probe_port is not None else None,
            worker=None
            if self.engine is None
            else WorkerSettings(
                leader_url="", token="", home=self.home, engine=self.engine, listen=("127.0.0.1", free_port())
            ),
        )

    # --- running on the leader's loop -------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the leader's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _serve(self) -> None:
        admin = self.up.listeners[1].app  # the app behind the admin listener, called over ASGI as well
        self._admin = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=admin), base_url=f"http://127.0.0.1:{self.admin_port}"
        )
        self._running = asyncio.create_task(self.up.serve())
        for _ in range(200):  # the listeners are bound already; serving starts within a few turns of the loop
            if self._public_up():
                break
            await asyncio.sleep(0.01)

    def _public_up(self) -> bool:
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

    def request_record(self, request_id: str) -> dict:
        """A ``/v1`` request's record (``GET /api/v1/requests/{id}``), once the ledger has committed it."""
        return self._found(f"/api/v1/requests/{request_id}", f"request {request_id} to be recorded")

    def request_body(self, request_id: str) -> dict:
        """A ``/v1`` request's kept body (``GET /api/v1/requests/{id}/body``), written just after its record."""
        self.request_record(request_id)
        return self._found(f"/api/v1/requests/{request_id}/body", f"the body of request {request_id}")

    def _found(self, path: str, what: str) -> dict:
        def found() -> dict | None:
            status, body = self.admin("GET", path)
            return body if status == 200 and isinstance(body, dict) else None

        return wait_until(found, 15, what)

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
        """Stop as Ctrl-C does: no new requests, the local worker's engines, the lifespan's order, the store
        closed; raises what the lifespan raised (where ``opod up`` would exit non-zero)."""
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.up.stop.set)
            self.call(self._finish(), timeout=60)
        finally:
            self._end_loop()

    def restart(self) -> InProcessLeader:
        """Stop, then open a leader again on the same home, addresses, settings and local worker."""
        self.stop()
        return InProcessLeader(
            self.home,
            default_models=self.default_models,
            env=self.env,
            ports=(self.port, self.admin_port),
            worker=self.engine,
            probe_port=self.probe_port,
        )

    async def _finish(self) -> None:
        await self._running
        await self._admin.aclose()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
        if self._installs is not None:
            self._installs.__exit__(None, None, None)
            self._installs = None
