"""Changes of nodes and quotas through the management API, on a leader in this process: each answers as the spec says,
commits its audit row with the change (``node:ID``, the quota's ``kind:ID``), and a refusal leaves its row with its
status. The node is one a worker registered an hour ago and that has not been heard from since: lost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opod.store import Store
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import http


def stored_node(home: Path, node_id: str) -> None:
    """A node registered an hour ago, before the leader starts: the leader reads it from the store."""
    home.mkdir(parents=True, exist_ok=True)
    with Store.open(None, home=home) as store:
        store.upsert_node(
            node_id,
            hostname=node_id,
            os="linux",
            arch="x86_64",
            ram_gb=64,
            address="127.0.0.1:9",
            at=datetime.now(UTC) - timedelta(hours=1),
        )


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[InProcessLeader]:
    stored_node(tmp_path / "home", "n_lost")
    up = InProcessLeader(tmp_path / "home")
    yield up
    up.stop()


def audit(leader: InProcessLeader, contains: str) -> list[dict[str, Any]]:
    status, rows = leader.admin("GET", f"/api/v1/audit?contains={contains}")
    assert status == 200, rows
    return list(rows)


def node(leader: InProcessLeader, node_id: str) -> dict[str, Any] | None:
    status, views = leader.admin("GET", "/api/v1/nodes")
    assert status == 200, views
    return next((v for v in views if v["id"] == node_id), None)


def test_the_operators_side_of_a_node_is_changed_and_audited_with_each_change(leader: InProcessLeader) -> None:
    assert leader.admin("POST", "/api/v1/nodes/n_lost/state", {"state": "cordon"}) == (
        200,
        {"id": "n_lost", "state": "cordoned"},
    )
    status, body = leader.admin("POST", "/api/v1/nodes/n_lost/labels", {"set": {"llmgw.io/rack": "r7"}})
    assert status == 200 and body["operator_labels"] == {"llmgw.io/rack": "r7"} and body["location"] == {"rack": "r7"}
    assert leader.admin("POST", "/api/v1/nodes/n_lost/engines", {"engine": "vllm", "build": "cu129"}) == (
        200,
        {"engine": "vllm", "build": "cu129"},
    )
    assert leader.admin("POST", "/api/v1/nodes/n_lost/upgrade", {"version": "9.9.9"}) == (
        200,
        {"node": "n_lost", "version": "9.9.9"},
    )
    view = node(leader, "n_lost")
    assert view is not None and view["state"] == "lost"  # its reachability first; the operator's state is kept
    assert view["operator_labels"] == {"llmgw.io/rack": "r7"} and view["engine_builds"] == {"vllm": "cu129"}

    status, body = leader.admin("POST", "/api/v1/nodes/n_lost/state", {"state": "asleep"})
    assert status == 400 and body["error"].startswith("state: 'asleep' is not a node state")
    status, body = leader.admin("POST", "/api/v1/nodes/n_nope/labels", {"set": {"a": "b"}})
    assert (status, body) == (404, {"error": "node 'n_nope' is not known; GET /api/v1/nodes lists them"})
    status, _, _ = http("POST", leader.url + "/admin/v1/nodes/n_lost/undrain", {}, key=leader.key)
    assert status == 200

    rows = [(r["action"], r.get("target", ""), r["status"]) for r in audit(leader, "/nodes/")]
    assert rows == [
        ("POST /admin/v1/nodes/{id}/undrain", "node:n_lost", 200),
        ("POST /api/v1/nodes/{id}/labels", "n_nope", 404),
        ("POST /api/v1/nodes/{id}/state", "n_lost", 400),
        ("POST /api/v1/nodes/{id}/upgrade", "node:n_lost", 200),
        ("POST /api/v1/nodes/{id}/engines", "node:n_lost", 200),
        ("POST /api/v1/nodes/{id}/labels", "node:n_lost", 200),
        ("POST /api/v1/nodes/{id}/state", "node:n_lost", 200),
    ]


def test_a_lost_node_is_forgotten_for_good(tmp_path: Path) -> None:
    home = tmp_path / "home"
    stored_node(home, "n_lost")
    up = InProcessLeader(home)
    try:
        assert node(up, "n_lost") is not None
        assert up.admin("DELETE", "/api/v1/nodes/n_lost") == (200, {"id": "n_lost", "removed": "true"})
        assert node(up, "n_lost") is None
        assert up.admin("DELETE", "/api/v1/nodes/n_lost")[0] == 404
        rows = [(r.get("target", ""), r["status"], r.get("detail", "")) for r in audit(up, "DELETE /api/v1/nodes")]
        assert rows == [("n_lost", 404, ""), ("node:n_lost", 200, '{"was":"lost"}')]
    finally:
        up.stop()
    again = InProcessLeader(home)
    try:
        assert node(again, "n_lost") is None, "a forgotten node is gone from the store too"
    finally:
        again.stop()


def test_a_quota_is_put_shown_and_removed_with_its_rows(leader: InProcessLeader) -> None:
    status, org = leader.admin("POST", "/api/v1/orgs", {"name": "acme"})
    assert status == 201, org
    scope = f"org:{org['id']}"
    assert leader.admin("PUT", "/api/v1/quotas", {"scope": "org:acme", "limit": {"gpus": 2}}) == (200, {"scope": scope})
    status, views = leader.admin("GET", "/api/v1/quotas")
    assert status == 200 and [(v["scope"], v["name"], v["limit"], v["holds"]) for v in views] == [
        (scope, "acme", {"gpus": 2}, {"GPUs": 0, "CPUCores": 0, "MemoryGB": 0})
    ]
    status, body = leader.admin(
        "PUT", "/api/v1/quotas", {"scope": "org:acme", "guarantee": {"gpus": 3}, "limit": {"gpus": 2}}
    )
    assert status == 400 and body["error"].startswith("guarantee.gpus: 3 is above limit.gpus 2")
    assert leader.admin("DELETE", "/api/v1/quotas/org:acme") == (200, {"removed": scope})
    assert leader.admin("DELETE", "/api/v1/quotas/org:acme")[0] == 404
    assert leader.admin("GET", "/api/v1/quotas") == (200, [])
    rows = [(r["action"], r.get("target", ""), r["status"]) for r in audit(leader, "/api/v1/quotas")]
    assert rows == [
        ("DELETE /api/v1/quotas/{scope}", "org:acme", 404),
        ("DELETE /api/v1/quotas/{scope}", scope, 200),
        ("PUT /api/v1/quotas", "", 400),
        ("PUT /api/v1/quotas", scope, 200),
    ]
