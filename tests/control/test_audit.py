"""The audit log as an operator reads it: every change through the management API and ``/admin/v1``, with its
actor, action, target and status, refusals included, filtered by ``since``, ``limit``, ``actor`` and ``contains``,
and never a secret in it — neither in ``GET /api/v1/audit`` nor in the store's table. Against a leader built in the
test's process."""

from __future__ import annotations

import http.client as httpclient
import json
import sqlite3
from collections.abc import Iterator

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("audit") / "home")
    yield up
    up.stop()


def change(leader: Leader, method: str, path: str, body: object, actor: str) -> tuple[int, object]:
    return leader.admin(method, path, body, headers={"X-Llmgw-Actor": actor})


def audit(leader: Leader, query: str = "") -> list[dict]:
    status, body = leader.admin("GET", "/api/v1/audit" + query)
    assert status == 200 and isinstance(body, list), body
    return body


def test_a_change_is_recorded_with_its_actor_action_target_and_status(leader: Leader) -> None:
    status, created = change(leader, "POST", "/api/v1/node-tokens", {"name": "rack-7"}, "alice@ops.example")
    assert status == 201 and isinstance(created, dict), created
    status, _ = change(leader, "DELETE", f"/api/v1/node-tokens/{created['id']}", {}, "alice@ops.example")
    assert status == 200
    rows = audit(leader, "?actor=alice@ops.example")
    assert [(r["action"], r["status"], r["source"]) for r in rows] == [
        ("DELETE /api/v1/node-tokens/{id}", 200, "api"),
        ("POST /api/v1/node-tokens", 201, "api"),
    ]  # newest first
    assert rows[0]["target"] == f"node-token:{created['id']}"
    assert '"rack-7"' in rows[1]["detail"]
    assert all(r["id"] > 0 and r["at"] for r in rows)


def test_a_refused_change_is_recorded_with_the_refusal(leader: Leader) -> None:
    status, _ = change(leader, "POST", "/api/v1/keys", {"name": 5}, "mallory")
    assert status == 400
    status, _ = change(leader, "DELETE", "/api/v1/keys/k_nope", {}, "mallory")
    assert status == 404
    assert sorted(r["status"] for r in audit(leader, "?actor=mallory")) == [400, 404]


def test_no_secret_is_ever_in_the_audit(leader: Leader) -> None:
    secrets: list[str] = []
    for name in ("one", "two"):
        status, created = change(leader, "POST", "/api/v1/keys", {"name": name}, "secret-keeper")
        assert status == 201 and isinstance(created, dict)
        secrets.append(created["secret"])
    # A secret a caller put in a body, by mistake or by design, is taken out too.
    change(leader, "POST", "/api/v1/node-tokens", {"name": f"leaked {secrets[0]}"}, "secret-keeper")
    change(
        leader, "PUT", "/api/v1/auth/secrets/scim-token", {"value": "scim-bearer-do-not-keep-7f3a9"}, "secret-keeper"
    )
    secrets.append("scim-bearer-do-not-keep-7f3a9")
    rows = audit(leader, "?actor=secret-keeper")
    assert len(rows) == 4
    text = repr(rows)
    with sqlite3.connect(leader.home / "opod.db") as db:
        table = repr(db.execute("SELECT * FROM audit").fetchall())
    for secret in secrets:
        assert secret not in text and secret not in table


def test_the_contracts_admin_writes_are_recorded(leader: Leader) -> None:
    status, _, _ = http("POST", leader.url + "/admin/v1/nodes/no-such-node/drain", {}, key=leader.key)
    assert status == 404
    rows = audit(leader, "?contains=/admin/v1/nodes")
    assert rows and rows[0]["action"] == "POST /admin/v1/nodes/{id}/drain" and rows[0]["status"] == 404
    assert rows[0]["target"] == "no-such-node"


def test_filters_narrow_the_answer(leader: Leader) -> None:
    for n in range(3):
        change(leader, "POST", "/api/v1/node-tokens", {"name": f"filtered-{n}"}, "filter-bob")
    assert len(audit(leader, "?actor=filter-bob&limit=2")) == 2
    assert {r["actor"] for r in audit(leader, "?contains=node-tokens")} >= {"filter-bob"}
    assert audit(leader, "?actor=filter-bob&contains=/api/v1/orgs") == []
    assert len(audit(leader, "?actor=filter-bob&since=1h")) == 3
    status, body = leader.admin("GET", "/api/v1/audit?since=yesterday")
    assert status == 400 and "since" in body["error"]  # type: ignore[index]
    status, body = leader.admin("GET", "/api/v1/audit?limit=0")
    assert status == 400 and "limit" in body["error"]  # type: ignore[index]


def test_an_oversized_body_is_refused_before_it_is_read(leader: Leader) -> None:
    conn = httpclient.HTTPConnection("127.0.0.1", leader.admin_port, timeout=10)
    conn.putrequest("POST", "/api/v1/node-tokens")
    for name, value in (
        ("Content-Type", "application/json"),
        ("Authorization", f"Bearer {leader.key}"),
        ("Content-Length", str(9 * 1024 * 1024)),
    ):
        conn.putheader(name, value)
    conn.endheaders()  # the body is never sent: the listener answers from the declared length
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 413 and "at most" in body["error"]


def test_a_change_the_store_refuses_is_recorded_with_its_refusal(leader: Leader) -> None:
    status, org = change(leader, "POST", "/api/v1/orgs", {"name": "quota-less"}, "carol")
    assert status == 201, org
    # The organization exists but holds no quota: the store refuses the removal, after the route began the change.
    status, _ = change(leader, "DELETE", "/api/v1/quotas/org:quota-less", {}, "carol")
    assert status == 404
    rows = audit(leader, "?actor=carol")
    assert [(r["action"], r["status"]) for r in rows] == [
        ("DELETE /api/v1/quotas/{scope}", 404),
        ("POST /api/v1/orgs", 201),
    ]


def test_a_change_the_listener_refuses_is_recorded_with_its_refusal(leader: Leader) -> None:
    # Refused before any route runs: not JSON, a body past the cap, no admin key. Each is recorded as its route
    # would be, with the refusal's status, and without the body it sent.
    sent = {"X-Llmgw-Actor": "eve"}
    form = {**sent, "Content-Type": "application/x-www-form-urlencoded"}
    assert leader.request("POST", "/api/v1/nodes/n_x/state", content=b"state=drain", headers=form).status_code == 415
    big = b'{"name": "' + b"x" * (9 << 20) + b'"}'
    assert leader.request("POST", "/api/v1/node-tokens", content=big, headers=sent).status_code == 413
    assert leader.request("DELETE", "/api/v1/keys/k_x", headers=sent, key="sk-opod-not-a-key").status_code == 401
    rows = audit(leader, "?actor=eve")
    assert [(r["action"], r["status"], r.get("target"), r.get("detail")) for r in rows] == [
        ("DELETE /api/v1/keys/{id}", 401, "k_x", None),
        ("POST /api/v1/node-tokens", 413, None, None),
        ("POST /api/v1/nodes/{id}/state", 415, "n_x", None),
    ]
