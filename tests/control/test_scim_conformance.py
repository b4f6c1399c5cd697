"""scim2-tester, a public SCIM 2.0 conformance suite (RFC 7643, RFC 7644), run whole against ``/scim/v2``.

Every check must pass: discovery, creation, reads with ``attributes`` and ``excludedAttributes``, searches by POST,
replacement, deletion, and PATCH add, remove and replace of every attribute the published schemas name, over real
HTTP on the leader's public listener.
"""

from __future__ import annotations

import httpx2
import pytest
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import Status, check_server

from tests.control.scim_support import admin
from tests.support.inprocess import InProcessLeader as Leader

TOKEN = "scim-conformance-7c1e9b0d4f2a"
PASSED = {Status.SUCCESS, Status.COMPLIANT, Status.ACCEPTABLE}


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    running = Leader(tmp_path_factory.mktemp("scim-conformance") / "leader")
    try:
        assert admin(running, "PUT", "/api/v1/auth/secrets/scim-token", {"value": TOKEN})[0] == 200
        yield running
    finally:
        running.stop()


def test_scim2_tester_passes_every_check(leader: Leader) -> None:
    with httpx2.Client(
        base_url=f"{leader.url}/scim/v2", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as http:
        results = check_server(SyncSCIMClient(http))
    failed = [
        f"{r.resource_type or '-'} {r.title}: {r.status.name}: {r.reason}" for r in results if r.status not in PASSED
    ]
    assert len(results) > 100, f"only {len(results)} checks ran"
    assert failed == [], "scim2-tester checks that did not pass:\n" + "\n".join(failed)
