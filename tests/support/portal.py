"""The members' portal on a leader in the test's process: its public app with a fixed person signed in.

:class:`PortalSite` builds the leader's public app (``/v1``, ``/portal``, everything the public
listener serves) with a :class:`~tests.support.console.FixedViewer` in front of the portal, and
calls it over ASGI, or serves it on a loopback port for a browser (whose playground then calls
``/v1`` on that same address). :func:`build_world` puts two teams' projects, two members and models
(one kept for a team) on a leader with a simulator worker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from opod.control.console.auth import CSRF_HEADER, Viewer
from tests.support.console import CSRF, FixedViewer
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, sim_worker
from tests.support.ports import free_port

CHAT = "sim-chat"
"""Served for everyone."""
KEPT = "sim-kept"
"""Served, kept for team acme/ops (bob's, not ada's)."""
EMBED = "all-minilm-l6-v2"
"""An embedding model, served for everyone."""


@dataclass
class World:
    leader: InProcessLeader
    worker: OpodProcess
    ids: dict[str, str]
    """``acme/ml/chat``, ``acme/ops/batch``, ``ada``, ``bob`` → their ids."""

    def viewer(self, who: str) -> Viewer:
        return Viewer(actor=f"{who}@example.com", name=who.capitalize(), role="", user_id=self.ids[who])

    def stop(self) -> None:
        self.worker.stop()
        self.leader.stop()


def build_world(root: Path) -> World:
    """acme/ml/chat (ada's project) and acme/ops/batch (bob's), the models above, served by a simulator worker."""
    leader = InProcessLeader(root / "leader")
    worker = sim_worker(leader, root / "worker", "portal-sim")
    try:
        ids: dict[str, str] = {}
        for path, body in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
            ("/api/v1/teams", {"name": "ops", "in": "acme"}),
            ("/api/v1/projects", {"name": "batch", "in": "acme/ops"}),
        ):
            status, item = leader.admin("POST", path, body)
            assert status == 201, item
            ids[(body.get("in", "") + "/" + body["name"]).lstrip("/")] = item["id"]
        people = leader.leader.control.people
        for who, project in (("ada", "acme/ml/chat"), ("bob", "acme/ops/batch")):
            record = leader.call(people.create(email=f"{who}@example.com", name=who.capitalize()))
            ids[who] = record.id
            status, body = leader.admin("POST", f"/api/v1/users/{record.id}/memberships", {"target": ids[project]})
            assert status == 200, body
        for name, owner in ((CHAT, None), (KEPT, "team:acme/ops"), (EMBED, None)):
            model: dict[str, Any] = {"name": name, "profiles": [{"engine": "sim"}], "scaling": {"min": 1}}
            if owner:
                model["owner"] = owner
            status, body = leader.admin("POST", "/api/v1/models", model)
            assert status == 200, body
        worker.wait_for_line("registered with", timeout=30)
        leader.wait_served(CHAT, KEPT, EMBED, timeout=90)
        return World(leader, worker, ids)
    except BaseException:
        worker.stop()
        leader.stop()
        raise


class PortalSite:
    """The public app of ``leader`` with ``auth`` in front of its portal; calls go over ASGI on the leader's loop."""

    def __init__(self, leader: InProcessLeader, auth: FixedViewer) -> None:
        self.leader = leader
        self.auth = auth
        self.app = leader.leader.public_app(auth)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url=f"http://127.0.0.1:{leader.port}"
        )
        self._server: uvicorn.Server | None = None

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
        return self.leader.call(self.client.get(path, headers=dict(headers or {})))

    def post(self, path: str, body: Mapping[str, Any], *, csrf: str | None = CSRF) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if csrf is not None:
            headers[CSRF_HEADER] = csrf
        return self.leader.call(self.client.post(path, content=json.dumps(body).encode(), headers=headers))

    def serve(self) -> str:
        """Serve the app on a loopback port (on the leader's loop); its base address."""
        port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self.leader.call(self._start())
        return f"http://127.0.0.1:{port}"

    async def _start(self) -> None:
        assert self._server is not None
        asyncio.get_running_loop().create_task(self._server.serve())
        for _ in range(200):
            if self._server.started:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the portal's test listener did not start")

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        self.leader.call(self.client.aclose())
