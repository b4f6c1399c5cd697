"""The console's pages on a leader in the test's process, seen by a fixed person: what the page tests talk to.

:class:`ConsoleSite` is the admin app (:func:`opod.control.app.create_app`, the listener's checks included) of a
real leader with a :class:`~tests.support.site.FixedViewer` in front of its console, a
:class:`~tests.support.site.Site`; :func:`console_as` is a module's fixture of it for one role, over the module's
``leader`` fixture. :func:`stored_nodes` fills a leader's home with the fleet-scale benchmark's nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.fleet_scale.shape import capabilities, node_id
from opod.control.app import create_app
from opod.store import Store
from tests.support.inprocess import InProcessLeader
from tests.support.site import FixedViewer, Site, person


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


class ConsoleSite(Site):
    """The admin app of ``leader`` with ``auth`` in front of its console."""

    def __init__(self, leader: InProcessLeader, auth: FixedViewer) -> None:
        super().__init__(leader, create_app(leader.leader.control, auth), leader.admin_port)
        self.auth = auth

    def audit(self, contains: str) -> list[dict[str, Any]]:
        status, rows = self.leader.admin("GET", f"/api/v1/audit?contains={contains}")
        assert status == 200, rows
        return list(rows)


def console_as(role: str) -> Callable[..., Iterator[ConsoleSite]]:
    """A test module's fixture (``operator = console_as("operator")``): the console of the module's ``leader`` with a
    person of ``role`` signed in, closed after each test."""

    @pytest.fixture
    def site(leader: InProcessLeader) -> Iterator[ConsoleSite]:
        made = ConsoleSite(leader, FixedViewer(person(role)))
        yield made
        made.close()

    return site
