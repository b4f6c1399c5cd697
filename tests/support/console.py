"""The console's pages on a leader in the test's process, seen by a fixed person: what the page tests talk to.

:class:`FixedViewer` is a :class:`~opod.control.console.auth.PageAuth` with one person signed in (or
nobody), a role's rights, and a fixed CSRF token: the pages' rendering and checks are tested without
sessions, which the sign-in area tests on its own. :class:`ConsoleSite` builds the admin app with it
(:func:`opod.control.app.create_app`, the listener's checks included) over a real leader, and calls it
over ASGI, or serves it on a loopback port for a browser.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.requests import Request

from bench.fleet_scale.shape import capabilities, node_id
from opod.control.app import create_app
from opod.control.console.auth import CSRF_HEADER, Viewer
from opod.store import Store
from tests.support.inprocess import InProcessLeader
from tests.support.ports import free_port

CSRF = "csrf-of-this-session"
RIGHTS = {
    "viewer": frozenset({"read"}),
    "operator": frozenset({"read", "operate"}),
    "admin": frozenset({"read", "operate", "keys", "settings", "administer"}),
}


@dataclass
class FixedViewer:
    """One person signed in for every request (``person`` None: nobody), with their role's rights."""

    person: Viewer | None
    token: str = CSRF
    asked: list[str] = field(default_factory=list)

    async def viewer(self, request: Request) -> Viewer | None:
        return self.person

    def may(self, viewer: Viewer, action: str) -> bool:
        self.asked.append(action)
        return action in RIGHTS.get(viewer.role, frozenset())

    def csrf_token(self, request: Request) -> str:
        return self.token if self.person is not None else ""


def person(role: str, actor: str | None = None) -> Viewer:
    return Viewer(actor=actor or f"{role}@example.com", name=f"{role.capitalize()} Person", role=role)


def stored_nodes(home: Path, count: int, *, labels: Mapping[str, str] | None = None) -> list[str]:
    """``count`` nodes of the fleet-scale benchmark's shape (8 GPUs each), registered before the leader starts."""
    home.mkdir(parents=True, exist_ok=True)
    ids = []
    with Store.open(None, home=home) as store:
        for i in range(count):
            caps = capabilities(i)
            if labels and caps.inventory is not None:
                caps.inventory.labels = {**(caps.inventory.labels or {}), **labels}
            store.upsert_node(
                node_id(i),
                hostname=caps.hostname,
                os="linux",
                arch="x86_64",
                ram_gb=64,
                address="127.0.0.1:9",
                hardware_json=caps.model_dump_json(),
                at=datetime.now(UTC) - timedelta(seconds=5),
            )
            ids.append(node_id(i))
    return ids


class ConsoleSite:
    """The admin app of ``leader`` with ``auth`` in front of its console; calls go over ASGI on the leader's loop."""

    def __init__(self, leader: InProcessLeader, auth: FixedViewer) -> None:
        self.leader = leader
        self.auth = auth
        self.app = create_app(leader.leader.control, auth)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url=f"http://127.0.0.1:{leader.admin_port}"
        )
        self._server: uvicorn.Server | None = None
        self.port = 0

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
        return self.leader.call(self.client.get(path, headers=dict(headers or {})))

    def post(self, path: str, body: Mapping[str, Any], *, csrf: str | None = CSRF) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if csrf is not None:
            headers[CSRF_HEADER] = csrf
        return self.leader.call(self.client.post(path, content=json.dumps(body).encode(), headers=headers))

    def audit(self, contains: str) -> list[dict[str, Any]]:
        status, rows = self.leader.admin("GET", f"/api/v1/audit?contains={contains}")
        assert status == 200, rows
        return list(rows)

    # --- a real listener, for a browser --------------------------------------------------------------

    def serve(self) -> str:
        """Serve the app on a loopback port (on the leader's loop); its base address."""
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self.leader.call(self._start())
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        assert self._server is not None
        asyncio.get_running_loop().create_task(self._server.serve())
        for _ in range(200):
            if self._server.started:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the console's test listener did not start")

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        self.leader.call(self.client.aclose())
