"""``/api/v1/users`` and ``/api/v1/auth`` on a real leader: people (provisioned through SCIM), their memberships,
the keys revoked when a person no longer reaches a project, and auth secrets that never come back.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.control.scim_support import admin, new_user, scim
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http

TOKEN = "scim-tok-0b7e44d2c1a96f3e"
LDAP_PASSWORD = "ldap-pw-7c2e9f1d"
KEY_SECRETS: list[str] = []


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    running = Leader(tmp_path_factory.mktemp("people") / "leader")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def world(leader: Leader) -> dict[str, str]:
    """acme/ml/chat, acme/ml/eval and acme/ops/batch, and two people provisioned through SCIM."""
    ids: dict[str, str] = {}
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("/api/v1/projects", {"name": "eval", "in": "acme/ml"}),
        ("/api/v1/teams", {"name": "ops", "in": "acme"}),
        ("/api/v1/projects", {"name": "batch", "in": "acme/ops"}),
    ):
        status, item = admin(leader, "POST", path, body)
        assert status == 201, item
        ids[(body.get("in", "") + "/" + body["name"]).lstrip("/")] = item["id"]
    assert admin(leader, "PUT", "/api/v1/auth/secrets/scim-token", {"value": TOKEN})[0] == 200
    for email, name in (("ada@example.com", "Ada Lovelace"), ("bob@example.com", "Bob Babbage")):
        status, _, user = scim(leader, "POST", "/Users", new_user(email, name), TOKEN)
        assert status == 201, user
        ids[email] = user["id"]
    return ids


def test_before_anyone_is_provisioned_the_list_is_empty_and_a_bad_state_is_refused(leader: Leader) -> None:
    assert admin(leader, "GET", "/api/v1/users") == (200, [])
    status, body = admin(leader, "GET", "/api/v1/users?state=gone")
    assert status == 400 and "pending, active, disabled" in body["error"]
    status, body = admin(leader, "GET", "/api/v1/users/nobody@example.com")
    assert status == 404 and "GET /api/v1/users" in body["error"]


def test_people_read_back_by_id_or_email_in_any_case(leader: Leader, world: dict[str, str]) -> None:
    status, people = admin(leader, "GET", "/api/v1/users?state=active")
    assert status == 200 and [p["email"] for p in people] == ["ada@example.com", "bob@example.com"]
    status, ada = admin(leader, "GET", "/api/v1/users/ADA@Example.COM")
    assert status == 200 and (ada["id"], ada["name"], ada["state"]) == (
        world["ada@example.com"],
        "Ada Lovelace",
        "active",
    )
    assert "role" not in ada and "created_at" in ada and "null" not in json.dumps(ada)


def test_a_membership_is_added_and_posting_it_again_changes_only_the_role(
    leader: Leader, world: dict[str, str]
) -> None:
    ada = world["ada@example.com"]
    status, view = admin(
        leader, "POST", f"/api/v1/users/{ada}/memberships", {"target": "org:acme", "role": "manager"}, actor="carol"
    )
    assert status == 200, view
    (membership,) = view["memberships"]
    assert (membership["target"], membership["path"], membership["role"], membership["by"]) == (
        world["acme"],
        "acme",
        "manager",
        "carol",
    )
    status, view = admin(leader, "POST", "/api/v1/users/ada@example.com/memberships", {"target": world["acme"]})
    assert status == 200 and [(m["target"], m["role"]) for m in view["memberships"]] == [(world["acme"], "member")]
    status, view = admin(leader, "POST", f"/api/v1/users/{ada}/memberships", {"target": "team:acme/ml"})
    assert {m["path"] for m in view["memberships"]} == {"acme", "acme/ml"}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({}, 400, "target: name where"),
        ({"target": "galaxy:far"}, 400, "not a kind of scope"),
        ({"target": "team:acme/nope"}, 404, "has no team 'nope'"),
        ({"target": "org:acme", "role": "owner"}, 400, "member, manager"),
    ],
)
def test_a_bad_membership_is_refused_naming_the_field(
    leader: Leader, world: dict[str, str], body: dict, status: int, words: str
) -> None:
    got, answer = admin(leader, "POST", f"/api/v1/users/{world['bob@example.com']}/memberships", body)
    assert got == status and words in answer["error"], answer
    assert admin(leader, "GET", f"/api/v1/users/{world['bob@example.com']}")[1].get("memberships", []) == []


def test_leaving_revokes_keys_only_in_the_projects_no_longer_reached(leader: Leader, world: dict[str, str]) -> None:
    bob = world["bob@example.com"]
    for target in ("team:acme/ml", "project:acme/ops/batch"):
        assert admin(leader, "POST", f"/api/v1/users/{bob}/memberships", {"target": target})[0] == 200
    keys = {}
    for project in ("acme/ml/chat", "acme/ml/eval", "acme/ops/batch"):
        status, key = admin(leader, "POST", "/api/v1/keys", {"name": project, "project": project, "user": bob})
        assert status == 201, key
        keys[project] = key
        KEY_SECRETS.append(key["secret"])
    status, view = admin(leader, "DELETE", f"/api/v1/users/{bob}/memberships", {"target": "team:acme/ml"})
    assert status == 200 and [m["path"] for m in view["memberships"]] == ["acme/ops/batch"]
    for project, key in keys.items():
        stays = project == "acme/ops/batch"
        assert admin(leader, "GET", f"/api/v1/keys/{key['id']}")[1]["state"] == ("active" if stays else "revoked")
        assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == (200 if stays else 401)
    status, answer = admin(leader, "DELETE", f"/api/v1/users/{bob}/memberships", {"target": "team:acme/ml"})
    assert status == 404 and "not a member of team:" in answer["error"]


def test_auth_secrets_are_kept_by_name_and_never_come_back(leader: Leader, world: dict[str, str]) -> None:
    status, answer = admin(leader, "PUT", "/api/v1/auth/secrets/root-password", {"value": "x"})
    assert status == 400 and "ldap-bind, oidc-client-secret, scim-token" in answer["error"]
    status, answer = admin(leader, "PUT", "/api/v1/auth/secrets/ldap-bind", {})
    assert status == 400 and answer["error"].startswith("value:")
    status, answer = admin(leader, "PUT", "/api/v1/auth/secrets/ldap-bind", {"value": LDAP_PASSWORD})
    assert status == 200 and answer["reference"] == "store:auth/ldap-bind" and LDAP_PASSWORD not in json.dumps(answer)
    assert admin(leader, "GET", "/api/v1/auth") == (200, {"signup_open": False, "scim": True})
    status, answer = admin(leader, "POST", "/api/v1/auth/ldap/test", {"password": LDAP_PASSWORD})
    assert status == 200 and answer["ok"] is False and answer["checks"][0]["step"] == "settings"
    assert "no auth.ldap is in force" in answer["checks"][0]["detail"]


def test_every_change_is_audited_by_its_actor_and_no_secret_is_in_the_audit(
    leader: Leader, world: dict[str, str]
) -> None:
    status, rows = admin(leader, "GET", "/api/v1/audit?limit=10000")
    assert status == 200
    memberships = [r for r in rows if r["action"] == "POST /api/v1/users/{id}/memberships" and r["status"] == 200]
    assert any(r["actor"] == "carol" and r["target"] == f"user:{world['ada@example.com']}" for r in memberships)
    assert any(
        r["action"] == "PUT /api/v1/auth/secrets/{name}" and r["target"] == "secret:auth/ldap-bind" for r in rows
    )
    with sqlite3.connect(Path(leader.home) / "opod.db") as db:
        stored = json.dumps(db.execute("SELECT * FROM audit").fetchall())
    assert any(
        r["action"] == "DELETE /api/v1/users/{id}/memberships" and "acme/ml/chat" in r.get("detail", "") for r in rows
    )
    for secret in (TOKEN, LDAP_PASSWORD, *KEY_SECRETS):
        assert secret not in stored and secret not in json.dumps(rows)
