"""``/api/v1`` with a session, over real HTTP: what each role and membership may do, the CSRF token every change
needs, the audit of each call (``source: web``, the person as actor), and the admin key working as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.control.signin_support import account, audit_rows, browser, signed_in
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    running = Leader(tmp_path_factory.mktemp("sessions") / "leader", worker="sim")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def node(leader: Leader) -> str:
    wait_until(lambda: len(leader.admin("GET", "/api/v1/nodes")[1]) == 1, 60, "the local worker to register")
    return str(leader.admin("GET", "/api/v1/nodes")[1][0]["id"])


@pytest.fixture(scope="module")
def world(leader: Leader) -> dict[str, str]:
    """acme/ml/chat and acme/ml/eval; mia a member of chat, max a manager of team ml."""
    ids: dict[str, str] = {}
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("/api/v1/projects", {"name": "eval", "in": "acme/ml"}),
    ):
        status, item = leader.admin("POST", path, body)
        assert status == 201, item
        ids[(body.get("in", "") + "/" + body["name"]).lstrip("/")] = item["id"]
    ids["mia"] = account(leader, "mia@example.com")
    ids["max"] = account(leader, "max@example.com")
    for who, target, role in (("mia", "project:acme/ml/chat", "member"), ("max", "team:acme/ml", "manager")):
        status, body = leader.admin("POST", f"/api/v1/users/{ids[who]}/memberships", {"target": target, "role": role})
        assert status == 200, body
    return ids


def test_a_viewer_reads_but_is_refused_a_change_with_an_error_view_and_the_refusal_is_audited(
    leader: Leader, node: str
) -> None:
    account(leader, "vic@example.com", "viewer")
    web, csrf = signed_in(leader, "vic@example.com")
    assert web.get("/api/v1/nodes").status_code == 200
    refused = web.post(f"/api/v1/nodes/{node}/state", json={"state": "drain"}, headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 403 and set(refused.json()) == {"error"}
    assert "needs an operator or an admin; vic@example.com is viewer" in refused.json()["error"]
    assert leader.admin("GET", "/api/v1/nodes")[1][0]["state"] == "ready"
    rows = audit_rows(leader, "vic@example.com", until=lambda rows: len(rows) >= 2)
    (row,) = [r for r in rows if r["action"] != "POST /signin"]
    assert (row["action"], row["status"], row["source"], row["target"]) == (
        "POST /api/v1/nodes/{id}/state",
        403,
        "web",
        node,
    )


def test_an_operator_drains_a_node_with_a_session_audited_from_the_web_as_themselves(leader: Leader, node: str) -> None:
    account(leader, "ola@example.com", "operator")
    web, csrf = signed_in(leader, "ola@example.com")
    drained = web.post(f"/api/v1/nodes/{node}/state", json={"state": "drain"}, headers={"X-CSRF-Token": csrf})
    assert drained.status_code == 200 and drained.json() == {"id": node, "state": "draining"}, drained.text
    rows = audit_rows(leader, "ola@example.com", until=lambda rows: len(rows) >= 2)
    assert [(r["action"], r["status"], r["source"]) for r in rows] == [
        ("POST /signin", 200, "web"),
        ("POST /api/v1/nodes/{id}/state", 200, "web"),
    ]
    ready = web.post(f"/api/v1/nodes/{node}/state", json={"state": "ready"}, headers={"X-CSRF-Token": csrf})
    assert ready.status_code == 200
    assert (
        web.put("/api/v1/auth/secrets/scim-token", json={"value": "x" * 20}, headers={"X-CSRF-Token": csrf}).status_code
        == 403
    )


def test_a_change_without_its_csrf_token_or_with_a_forged_one_is_refused_and_nothing_changes(
    leader: Leader, node: str
) -> None:
    account(leader, "oz@example.com", "operator")
    web, csrf = signed_in(leader, "oz@example.com")
    one_off = csrf[:-1] + ("1" if csrf[-1] == "0" else "0")  # the token but for its last character
    for headers in ({}, {"X-CSRF-Token": "forged"}, {"X-CSRF-Token": one_off}):
        refused = web.post(f"/api/v1/nodes/{node}/state", json={"state": "cordon"}, headers=headers)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"], refused.text
    assert leader.admin("GET", "/api/v1/nodes")[1][0]["state"] == "ready"
    assert [(r["status"], r["source"]) for r in audit_rows(leader, "oz@example.com", until=lambda r: len(r) >= 4)] == [
        (200, "web")
    ] + [(403, "web")] * 3
    with browser(leader) as stranger:  # no session, no key: as before
        assert stranger.get("/api/v1/nodes").status_code == 401
        stranger.cookies.set("opod_session", "made-up")
        ended = stranger.get("/api/v1/nodes")
        assert ended.status_code == 401 and "sign in again" in ended.json()["error"]


def test_a_member_makes_and_revokes_their_own_key_in_their_project_but_not_in_another(
    leader: Leader, world: dict[str, str]
) -> None:
    web, csrf = signed_in(leader, "mia@example.com")
    header = {"X-CSRF-Token": csrf}
    made = web.post(
        "/api/v1/keys", json={"name": "mine", "project": "acme/ml/chat", "user": world["mia"]}, headers=header
    )
    assert made.status_code == 201 and made.json()["secret"].startswith("sk-"), made.text
    listed = web.get("/api/v1/keys?project=acme/ml/chat")
    assert listed.status_code == 200 and [k["id"] for k in listed.json()] == [made.json()["id"]]
    elsewhere = web.post("/api/v1/keys", json={"project": "acme/ml/eval", "user": world["mia"]}, headers=header)
    assert elsewhere.status_code == 403 and "project acme/ml/eval" in elsewhere.json()["error"]
    for_another = web.post("/api/v1/keys", json={"project": "acme/ml/chat", "user": world["max"]}, headers=header)
    assert for_another.status_code == 403 and "your own keys only" in for_another.json()["error"]
    assert web.get("/api/v1/keys").status_code == 403  # every project's keys: not a member's to read
    assert web.get("/api/v1/nodes").status_code == 403
    revoked = web.delete(f"/api/v1/keys/{made.json()['id']}", headers={**header, "Content-Type": "application/json"})
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    rows = [
        (r["action"], r["status"], r["source"])
        for r in audit_rows(leader, "mia@example.com", until=lambda rows: any(r["status"] == 403 for r in rows))
    ]
    assert ("POST /api/v1/keys", 201, "web") in rows and ("POST /api/v1/keys", 403, "web") in rows


def test_a_team_manager_manages_keys_and_members_within_the_team_only(leader: Leader, world: dict[str, str]) -> None:
    web, csrf = signed_in(leader, "max@example.com")
    header = {"X-CSRF-Token": csrf}
    mias = web.post("/api/v1/keys", json={"project": "acme/ml/eval", "user": world["mia"]}, headers=header)
    assert mias.status_code == 403 or mias.status_code == 400  # mia is not in eval: the key rules refuse it
    project_key = web.post("/api/v1/keys", json={"project": "acme/ml/eval"}, headers=header)
    assert project_key.status_code == 201, project_key.text
    joined = web.post(
        f"/api/v1/users/{world['mia']}/memberships", json={"target": "project:acme/ml/eval"}, headers=header
    )
    assert joined.status_code == 200, joined.text
    status, org = leader.admin("POST", "/api/v1/teams", {"name": "ops", "in": "acme"})
    assert status == 201, org
    outside = web.post(f"/api/v1/users/{world['mia']}/memberships", json={"target": "team:acme/ops"}, headers=header)
    assert outside.status_code == 403 and "a manager of the place" in outside.json()["error"]


def test_billing_changes_prices_but_not_the_rest_of_the_settings(leader: Leader) -> None:
    account(leader, "bea@example.com", "billing")
    web, csrf = signed_in(leader, "bea@example.com")
    base = web.get("/api/v1/settings").json().get("version", 0)
    header = {"X-CSRF-Token": csrf}
    prices = {"base": base, "body": 'prices:\n  "*": {input_per_million: 1.5}\n'}
    assert web.put("/api/v1/settings", json=prices, headers=header).status_code == 200
    more = {"base": base + 1, "body": 'prices:\n  "*": {input_per_million: 1.5}\nkeys:\n  max_lifetime: 24h\n'}
    refused = web.put("/api/v1/settings", json=more, headers=header)
    assert refused.status_code == 403 and "this also changes keys" in refused.json()["error"]


def test_the_admin_key_works_as_before_and_wins_over_a_session(leader: Leader, node: str) -> None:
    status, nodes = leader.admin("GET", "/api/v1/nodes")
    assert status == 200 and nodes[0]["id"] == node
    status, body = leader.admin("POST", f"/api/v1/nodes/{node}/state", {"state": "ready"}, {"X-Llmgw-Actor": "script"})
    assert status == 200, body
    assert [(r["source"], r["status"]) for r in audit_rows(leader, "script", until=bool)] == [("api", 200)]
    account(leader, "vi@example.com", "viewer")
    web, _ = signed_in(leader, "vi@example.com")
    as_admin = web.post(
        f"/api/v1/nodes/{node}/state", json={"state": "ready"}, headers={"Authorization": f"Bearer {leader.key}"}
    )
    assert as_admin.status_code == 200
    wrong_key = web.get("/api/v1/nodes", headers={"Authorization": "Bearer sk-wrong"})
    assert wrong_key.status_code == 401
