"""The members' portal on a leader in the test's process: its public app with a fixed person signed in.

:class:`PortalSite` is the leader's public app (``/v1``, ``/portal``, everything the public listener serves)
with a :class:`~tests.support.site.FixedViewer` in front of the portal, a :class:`~tests.support.site.Site` (served
for a browser, its playground calls ``/v1`` on that same address). :func:`build_world` puts two teams' projects, two
members and models (one kept for a team) on a leader with a simulator worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opod.control.console.auth import Viewer
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, sim_worker
from tests.support.site import FixedViewer, Site

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


class PortalSite(Site):
    """The public app of ``leader`` with ``auth`` in front of its portal."""

    def __init__(self, leader: InProcessLeader, auth: FixedViewer) -> None:
        super().__init__(leader, leader.leader.public_app(auth), leader.port)
        self.auth = auth
