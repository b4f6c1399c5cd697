"""What the snapshot, guardrail and door tests share: atomic writes, real servers on free ports, events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from opod.access.service import AccessService
from opod.contract.adminapi import PolicyAdmission
from opod.fleet.local import LocalEngines
from opod.fleet.models import ModelRegistry
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet
from opod.gateway.build import build_gateway
from opod.http.nodeclient import WorkerClient
from opod.http.serving import QuietServer, bind
from opod.ledger import Ledger
from opod.security.nodetokens import NodeTokenMinter
from opod.security.signer import Signer
from opod.snapshots.service import SnapshotPaths, Snapshots
from opod.store import Store


def write_atomic(path: Path, content: Any) -> None:
    """What a manager does: write a temp file beside the target, then rename it over."""
    data = content if isinstance(content, (bytes, str)) else json.dumps(content, indent=2)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


class Events:
    """An ``emit`` that records what it is given."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, type_: str, subject: str, data: dict[str, Any]) -> None:
        self.items.append((type_, subject, data))

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [d for t, _, d in self.items if t == type_]

    def types(self) -> list[str]:
        return [t for t, _, _ in self.items]


async def eventually(
    check: Callable[[], Any] | Callable[[], Awaitable[Any]], within: float = 2.0, step: float = 0.05
) -> float:
    """Wait until ``check()`` is truthy; returns the seconds it took, fails after ``within``."""
    start = time.monotonic()
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"not true within {within} s")
        await asyncio.sleep(step)


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app on a free loopback port in this event loop; yields its base URL."""
    sock = bind("127.0.0.1", 0, "a test server")
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", loop="none", timeout_graceful_shutdown=1
    )
    server = QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def open_access(home: Path) -> AccessService:
    """The leader's access service over a SQLite store in ``home`` (opened again after a close: a restart)."""
    home.mkdir(parents=True, exist_ok=True)
    return AccessService.load(Store.open(home=home), NodeTokenMinter(secrets.token_bytes(32)))


@contextlib.contextmanager
def gateway_app(
    access: AccessService, home: Path, require_keys: bool = True, snapshots: Snapshots | None = None
) -> Iterator[Starlette]:
    """The real ``/v1`` gateway reading ``access``'s key table, with no worker behind it.

    Give the test's ``snapshots`` when it has them: a second set would apply its own (empty) policy.
    """
    policies = snapshots if snapshots is not None else Snapshots(access, paths=SnapshotPaths())
    ledger = Ledger.open(access.store, home / "gateway")
    try:
        fleet = Fleet()
        gateway = build_gateway(
            fleet=fleet,
            models=ModelRegistry(),
            keys=access.keys,
            workers=WorkerClient(lambda _: None, Signer),
            index=PrefixIndex(),
            local=LocalEngines(),
            usage=ledger,
            policies=policies,
            admission=PolicyAdmission(),
            require_keys=require_keys,
        )
        yield Starlette(routes=gateway.routes())
    finally:
        ledger.close()
