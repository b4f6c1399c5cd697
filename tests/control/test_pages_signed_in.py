"""The console and the portal with real sessions: signed in at /signin, a page is the person's, a change needs their
CSRF token and their role, and nobody signed in is sent to sign in."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.control.signin_support import account, audit_rows, browser, signed_in
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import sim_worker

NODE = "n_pages"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root = tmp_path_factory.mktemp("pages")
    running = Leader(root / "leader")
    worker = sim_worker(running, root / "worker", NODE)
    worker.wait_for_line("registered with", timeout=30)
    yield running
    worker.stop()
    running.stop()


def _csrf(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]*)">', html)
    assert found is not None, html[:400]
    return found.group(1)


def test_nobody_signed_in_is_sent_to_sign_in(leader: Leader) -> None:
    with browser(leader) as web:
        answer = web.get("/console/nodes", follow_redirects=False)
    assert answer.status_code in (302, 303, 307) and answer.headers["location"].startswith("/signin")


def test_an_operator_drains_a_node_from_the_console_with_the_pages_token(leader: Leader) -> None:
    account(leader, "opa@example.com", "operator")
    web, token = signed_in(leader, "opa@example.com")
    page = web.get("/console/nodes")
    assert page.status_code == 200 and "opa@example.com" in page.text and NODE in page.text
    assert _csrf(page.text) == token
    refused = web.post(f"/console/nodes/{NODE}/state", json={"state": "drain"})
    assert refused.status_code == 403
    assert _state(leader) == "ready"
    done = web.post(f"/console/nodes/{NODE}/state", json={"state": "drain"}, headers={"X-CSRF-Token": token})
    assert done.status_code == 200, done.text
    assert _state(leader) == "draining"
    web.post(f"/console/nodes/{NODE}/state", json={"state": "ready"}, headers={"X-CSRF-Token": token})
    rows = [r for r in audit_rows(leader, "opa@example.com") if r["action"] == "POST /api/v1/nodes/{id}/state"]
    assert [(r["status"], r["source"]) for r in rows][-2:] == [(200, "web"), (200, "web")]


def test_a_viewer_reads_the_console_and_is_refused_a_change(leader: Leader) -> None:
    account(leader, "vera@example.com", "viewer")
    web, token = signed_in(leader, "vera@example.com")
    assert web.get("/console/nodes").status_code == 200
    refused = web.post(f"/console/nodes/{NODE}/state", json={"state": "drain"}, headers={"X-CSRF-Token": token})
    assert refused.status_code == 403
    assert _state(leader) == "ready"


def test_a_member_signed_in_on_the_public_listener_sees_their_portal(leader: Leader) -> None:
    account(leader, "mel@example.com")
    web, _ = signed_in(leader, "mel@example.com", public=True)
    keys = web.get("/portal/keys")
    assert keys.status_code == 200 and "mel@example.com" in keys.text
    assert web.get("/console/nodes").status_code == 404, "the console is on the admin listener only"


def _state(leader: Leader) -> str:
    return next(n["state"] for n in leader.admin("GET", "/api/v1/nodes")[1] if n["id"] == NODE)
