"""SCIM 2.0 provisioning, called as an identity provider calls it: people and groups kept in step, keys stopped.

One real leader for the module; the tests run in order, each building on what the ones before provisioned.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.control.scim_support import (
    ERROR_SCHEMA,
    GROUP_SCHEMA,
    LIST_SCHEMA,
    USER_SCHEMA,
    admin,
    map_groups,
    new_user,
    patch,
    scim,
)
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, wait_until

TOKEN = "scim-tok-5d1f0c7e9a2b4c68"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
KEY_SECRETS: list[str] = []
"""Every key secret the tests were given: none may appear in the audit."""


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    running = Leader(tmp_path_factory.mktemp("scim") / "leader")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def tree(leader: Leader) -> dict[str, str]:
    """acme/ml/chat and acme/ops/batch, by ID."""
    ids = {}
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("/api/v1/teams", {"name": "ops", "in": "acme"}),
        ("/api/v1/projects", {"name": "batch", "in": "acme/ops"}),
    ):
        status, item = admin(leader, "POST", path, body)
        assert status == 201, item
        ids[(body.get("in", "") + "/" + body["name"]).lstrip("/")] = item["id"]
    return ids


def test_without_a_token_scim_is_off(leader: Leader) -> None:
    status, headers, body = scim(leader, "GET", "/Users", token="anything")
    assert status == 404 and headers["content-type"].startswith("application/scim+json")
    assert body["schemas"] == [ERROR_SCHEMA] and "PUT /api/v1/auth/secrets/scim-token" in body["detail"]
    assert admin(leader, "GET", "/api/v1/auth") == (200, {"signup_open": False, "scim": False})


def test_the_operator_stores_the_token_and_a_wrong_one_is_refused(leader: Leader) -> None:
    status, body = admin(leader, "PUT", "/api/v1/auth/secrets/scim-token", {"value": TOKEN})
    assert status == 200 and body["reference"] == "store:auth/scim-token" and TOKEN not in json.dumps(body)
    assert admin(leader, "GET", "/api/v1/auth")[1]["scim"] is True
    for token in (None, "not-the-token"):
        status, headers, body = scim(leader, "GET", "/Users", token=token)
        assert status == 401 and body["schemas"] == [ERROR_SCHEMA] and body["status"] == "401"
        assert headers["www-authenticate"].startswith("Bearer")


def test_a_provider_creates_a_person_and_finds_them_by_user_name(leader: Leader) -> None:
    status, headers, ada = scim(leader, "POST", "/Users", new_user("Ada@Example.com", "Ada Lovelace", "ext-ada"), TOKEN)
    assert status == 201, ada
    assert ada["id"].startswith("usr_") and ada["userName"] == "Ada@Example.com" and ada["active"] is True
    assert ada["externalId"] == "ext-ada" and ada["schemas"] == [USER_SCHEMA]
    assert headers["location"] == ada["meta"]["location"] and headers["location"].endswith(
        f"/scim/v2/Users/{ada['id']}"
    )
    status, _, again = scim(leader, "POST", "/Users", new_user("ada@example.com"), TOKEN)
    assert status == 409 and again["scimType"] == "uniqueness"
    status, _, found = scim(leader, "GET", "/Users?filter=userName%20eq%20%22ADA@example.com%22", token=TOKEN)
    assert status == 200 and found["schemas"] == [LIST_SCHEMA] and found["totalResults"] == 1
    assert found["Resources"][0]["id"] == ada["id"]
    status, _, none = scim(leader, "GET", "/Users?filter=userName%20eq%20%22nobody@example.com%22", token=TOKEN)
    assert (status, none["totalResults"], none.get("Resources", [])) == (200, 0, [])
    status, _, bad = scim(leader, "GET", "/Users?filter=userName%20is%20%22x%22", token=TOKEN)
    assert status == 400 and bad["scimType"] == "invalidFilter" and bad["schemas"] == [ERROR_SCHEMA]
    status, person = admin(leader, "GET", "/api/v1/users/ada@example.com")
    assert status == 200 and (person["id"], person["name"], person["state"]) == (ada["id"], "Ada Lovelace", "active")


def test_listing_pages_with_start_index_and_count(leader: Leader) -> None:
    for n in range(3):
        assert scim(leader, "POST", "/Users", new_user(f"page{n}@example.com"), TOKEN)[0] == 201
    status, _, page = scim(leader, "GET", "/Users?startIndex=2&count=2", token=TOKEN)
    assert status == 200 and page["totalResults"] == 4 and page["startIndex"] == 2 and page["itemsPerPage"] == 2
    assert [u["userName"] for u in page["Resources"]] == ["page0@example.com", "page1@example.com"]


def test_a_provider_updates_a_person_with_patch_and_put(leader: Leader) -> None:
    ada = _find(leader, "ada@example.com")
    status, _, changed = scim(
        leader,
        "PATCH",
        f"/Users/{ada['id']}",
        patch({"op": "Replace", "path": "displayName", "value": "Countess Ada"}),
        TOKEN,
    )
    assert status == 200 and changed["displayName"] == "Countess Ada"
    assert admin(leader, "GET", f"/api/v1/users/{ada['id']}")[1]["name"] == "Countess Ada"
    status, _, changed = scim(
        leader,
        "PATCH",
        f"/Users/{ada['id']}",
        patch({"op": "replace", "path": "name.givenName", "value": "Augusta"}),
        TOKEN,
    )
    assert status == 200 and changed["name"]["givenName"] == "Augusta", changed
    assert changed["displayName"] == "Countess Ada"  # what the provider wrote reads back as it wrote it
    body = new_user("ada.lovelace@example.com", "Ada King", "ext-ada")
    body["id"] = ada["id"]
    status, _, replaced = scim(leader, "PUT", f"/Users/{ada['id']}", body, TOKEN)
    assert status == 200 and replaced["userName"] == "ada.lovelace@example.com"
    status, person = admin(leader, "GET", f"/api/v1/users/{ada['id']}")
    assert (person["email"], person["name"]) == ("ada.lovelace@example.com", "Ada King")
    status, _, missing = scim(
        leader, "PATCH", "/Users/usr_nobody", patch({"op": "replace", "value": {"active": False}}), TOKEN
    )
    assert status == 404 and missing["schemas"] == [ERROR_SCHEMA]


def test_a_deactivated_persons_key_stops_on_v1_at_once_and_comes_back(leader: Leader, tree: dict[str, str]) -> None:
    ada = _find(leader, "ada.lovelace@example.com")
    assert admin(leader, "POST", f"/api/v1/users/{ada['id']}/memberships", {"target": "project:acme/ml/chat"})[0] == 200
    status, key = admin(leader, "POST", "/api/v1/keys", {"name": "ada's", "project": "acme/ml/chat", "user": ada["id"]})
    assert status == 201, key
    KEY_SECRETS.append(key["secret"])
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200
    # Entra ID's way: a PATCH with active as text, no path
    status, _, off = scim(
        leader, "PATCH", f"/Users/{ada['id']}", patch({"op": "Replace", "value": {"active": "False"}}), TOKEN
    )
    assert status == 200 and off["active"] is False
    status, _, refused = http("GET", f"{leader.url}/v1/models", key=key["secret"])
    assert status == 401, refused
    assert admin(leader, "GET", "/api/v1/users?state=disabled")[1][0]["id"] == ada["id"]
    # Okta's way: PUT the whole person with active true
    body = new_user("ada.lovelace@example.com", "Ada King", "ext-ada", active=True)
    assert scim(leader, "PUT", f"/Users/{ada['id']}", body, TOKEN)[0] == 200
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200
    status, _, off = scim(
        leader, "PATCH", f"/Users/{ada['id']}", patch({"op": "replace", "path": "active", "value": False}), TOKEN
    )
    assert status == 200 and off["active"] is False
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 401
    assert (
        scim(leader, "PATCH", f"/Users/{ada['id']}", patch({"op": "replace", "path": "active", "value": True}), TOKEN)[
            0
        ]
        == 200
    )
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200


def test_a_mapped_group_push_makes_memberships_and_taking_someone_out_revokes_their_keys(
    leader: Leader, tree: dict[str, str]
) -> None:
    map_groups(leader, {"ML Engineers": "acme/ml"})
    bob = scim(leader, "POST", "/Users", new_user("bob@example.com", "Bob Babbage"), TOKEN)[2]
    cyd = scim(leader, "POST", "/Users", new_user("cyd@example.com"), TOKEN)[2]
    status, headers, group = scim(
        leader,
        "POST",
        "/Groups",
        {"schemas": [GROUP_SCHEMA], "displayName": "ML Engineers", "members": [{"value": bob["id"]}]},
        TOKEN,
    )
    assert status == 201, group
    assert group["id"].startswith("grp_") and group["displayName"] == "ML Engineers"
    assert headers["location"].endswith(f"/scim/v2/Groups/{group['id']}")
    assert [m["value"] for m in group["members"]] == [bob["id"]]
    group_id = group["id"]
    (membership,) = admin(leader, "GET", f"/api/v1/users/{bob['id']}")[1]["memberships"]
    assert (membership["target"], membership["path"], membership["role"], membership["by"]) == (
        tree["acme/ml"],
        "acme/ml",
        "member",
        "scim",
    )
    status, key = admin(leader, "POST", "/api/v1/keys", {"name": "bob's", "project": "acme/ml/chat", "user": bob["id"]})
    assert status == 201, key
    KEY_SECRETS.append(key["secret"])
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200

    status, _, found = scim(leader, "GET", "/Groups?filter=displayName%20eq%20%22ml%20engineers%22", token=TOKEN)
    assert status == 200 and [g["id"] for g in found["Resources"]] == [group_id]
    status, _, group = scim(
        leader,
        "PATCH",
        f"/Groups/{group_id}",
        patch({"op": "Add", "path": "members", "value": [{"value": cyd["id"]}]}),
        TOKEN,
    )
    assert status == 200 and {m["value"] for m in group["members"]} == {bob["id"], cyd["id"]}
    status, _, user = scim(leader, "GET", f"/Users/{cyd['id']}", token=TOKEN)
    assert [g["display"] for g in user["groups"]] == ["ML Engineers"]

    status, _, group = scim(
        leader,
        "PATCH",
        f"/Groups/{group_id}",
        patch({"op": "Remove", "path": f'members[value eq "{bob["id"]}"]'}),
        TOKEN,
    )
    assert status == 200 and [m["value"] for m in group["members"]] == [cyd["id"]]
    assert admin(leader, "GET", f"/api/v1/users/{bob['id']}")[1].get("memberships", []) == []
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 401
    assert admin(leader, "GET", f"/api/v1/keys/{key['id']}")[1]["state"] == "revoked"

    status, _, refused = scim(
        leader,
        "PATCH",
        f"/Groups/{group_id}",
        patch({"op": "add", "path": "members", "value": [{"value": "usr_nobody"}]}),
        TOKEN,
    )
    assert status == 400 and "usr_nobody" in refused["detail"] and refused["schemas"] == [ERROR_SCHEMA]
    status, _, group = scim(
        leader,
        "PUT",
        f"/Groups/{group_id}",
        {"schemas": [GROUP_SCHEMA], "displayName": "ML Engineers", "members": [{"value": bob["id"]}]},
        TOKEN,
    )
    assert status == 200 and [m["value"] for m in group["members"]] == [bob["id"]]  # a PUT replaces the members whole
    assert _paths(leader, cyd["id"]) == [] and _paths(leader, bob["id"]) == ["acme/ml"]
    # Renamed out of the mapping, the group grants nothing; renamed back, it grants again.
    rename = patch({"op": "Replace", "value": {"displayName": "ML Alumni"}})
    assert scim(leader, "PATCH", f"/Groups/{group_id}", rename, TOKEN)[2]["displayName"] == "ML Alumni"
    assert _paths(leader, bob["id"]) == []
    rename = patch({"op": "replace", "path": "displayName", "value": "ML Engineers"})
    assert scim(leader, "PATCH", f"/Groups/{group_id}", rename, TOKEN)[0] == 200
    assert _paths(leader, bob["id"]) == ["acme/ml"]
    status, _, listed = scim(leader, "GET", "/Groups?excludedAttributes=members", token=TOKEN)
    assert [g["displayName"] for g in listed["Resources"]] == ["ML Engineers"]
    assert all("members" not in g for g in listed["Resources"])
    assert scim(leader, "DELETE", f"/Groups/{group_id}", token=TOKEN)[0] == 204
    status, _, gone = scim(leader, "GET", f"/Groups/{group_id}", token=TOKEN)
    assert status == 404 and gone["schemas"] == [ERROR_SCHEMA]
    assert _paths(leader, bob["id"]) == []


def test_an_unmapped_group_is_kept_and_shown_and_grants_nothing_until_the_mapping_names_it(
    leader: Leader, tree: dict[str, str]
) -> None:
    dan = scim(leader, "POST", "/Users", new_user("dan@example.com"), TOKEN)[2]
    body = {"schemas": [GROUP_SCHEMA], "displayName": "Engineering", "members": [{"value": dan["id"]}]}
    status, _, group = scim(leader, "POST", "/Groups", body, TOKEN)
    assert status == 201 and group["displayName"] == "Engineering", group
    assert _paths(leader, dan["id"]) == []
    status, _, found = scim(leader, "GET", "/Groups?filter=displayName%20eq%20%22Engineering%22", token=TOKEN)
    assert [g["id"] for g in found["Resources"]] == [group["id"]]
    rows = admin(leader, "GET", "/api/v1/audit?actor=scim&limit=1000")[1]
    (created,) = [r for r in rows if r["action"] == "POST /scim/v2/Groups" and r["target"] == f"group:{group['id']}"]
    assert "grants" in created["detail"] and "nothing" in created["detail"]
    # The operator maps it, as a manager of a project: it applies at once, and a key in the project works.
    map_groups(leader, {"ML Engineers": "acme/ml", "engineering": {"target": "acme/ops/batch", "role": "manager"}})
    wait_until(lambda: _paths(leader, dan["id"]) == ["acme/ops/batch"], 10, "the mapping applied")
    (membership,) = admin(leader, "GET", f"/api/v1/users/{dan['id']}")[1]["memberships"]
    assert (membership["role"], membership["by"]) == ("manager", "scim")
    status, key = admin(
        leader, "POST", "/api/v1/keys", {"name": "dan's", "project": "acme/ops/batch", "user": dan["id"]}
    )
    assert status == 201, key
    KEY_SECRETS.append(key["secret"])
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200
    # Unmapped again: the membership SCIM made is taken back, with the key.
    map_groups(leader, {"ML Engineers": "acme/ml"})
    wait_until(lambda: _paths(leader, dan["id"]) == [], 10, "the mapping's entry taken back")
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 401
    status, _, kept = scim(leader, "GET", f"/Groups/{group['id']}", token=TOKEN)
    assert status == 200 and [m["value"] for m in kept["members"]] == [dan["id"]]  # the group itself is kept


def test_a_mapping_that_is_not_a_path_is_refused_with_its_field(leader: Leader) -> None:
    status, current = admin(leader, "GET", "/api/v1/settings")
    body = "auth:\n  scim_groups:\n    Engineering: acme//eng\n"
    status, refused = admin(leader, "PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 400 and "scim_groups" in json.dumps(refused) and "ORG/TEAM" in json.dumps(refused), refused


def test_delete_disables_the_person_and_keeps_the_record(leader: Leader) -> None:
    cyd = _find(leader, "cyd@example.com")
    assert scim(leader, "DELETE", f"/Users/{cyd['id']}", token=TOKEN)[0] == 204
    status, person = admin(leader, "GET", "/api/v1/users/cyd@example.com")
    assert status == 200 and person["state"] == "disabled"
    status, _, gone = scim(leader, "GET", f"/Users/{cyd['id']}", token=TOKEN)
    assert status == 404 and gone["schemas"] == [ERROR_SCHEMA]
    # Provisioned again, the same person comes back (their id and record kept), active.
    status, _, again = scim(leader, "POST", "/Users", new_user("cyd@example.com"), TOKEN)
    assert status == 201 and again["id"] == cyd["id"] and again["active"] is True


def test_discovery_says_what_opod_supports(leader: Leader) -> None:
    status, headers, config = scim(leader, "GET", "/ServiceProviderConfig", token=TOKEN)
    assert status == 200 and headers["content-type"].startswith("application/scim+json")
    assert (
        config["patch"]["supported"] is True
        and config["bulk"]["supported"] is False
        and config["filter"]["supported"] is True
    )
    assert config["authenticationSchemes"][0]["type"] == "oauthbearertoken"
    status, _, types = scim(leader, "GET", "/ResourceTypes", token=TOKEN)
    assert status == 200 and {t["endpoint"] for t in types["Resources"]} == {"/Users", "/Groups"}
    status, _, schemas = scim(leader, "GET", "/Schemas", token=TOKEN)
    assert status == 200 and {s["id"] for s in schemas["Resources"]} == {USER_SCHEMA, GROUP_SCHEMA, ENTERPRISE}
    assert scim(leader, "GET", f"/Schemas/{USER_SCHEMA}", token=TOKEN)[2]["name"] == "User"


def test_every_scim_change_is_audited_and_no_secret_is_anywhere(leader: Leader) -> None:
    status, rows = admin(leader, "GET", "/api/v1/audit?actor=scim&limit=1000")
    assert status == 200
    actions = {r["action"] for r in rows}
    assert {"POST /scim/v2/Users", "POST /scim/v2/Groups"} <= actions
    assert any(a.startswith("PATCH /scim/v2/Users/") for a in actions) and any(
        a.startswith("DELETE /scim/v2/Users/") for a in actions
    )
    assert all(r["source"] == "api" for r in rows)
    assert any(r["status"] == 409 for r in rows)  # a refused change is recorded too
    everything = json.dumps(admin(leader, "GET", "/api/v1/audit?limit=10000")[1])
    assert TOKEN not in everything
    with sqlite3.connect(Path(leader.home) / "opod.db") as db:  # the audit table itself, row by row
        stored = json.dumps(db.execute("SELECT * FROM audit").fetchall())
        assert "POST /scim/v2/Users" in stored and KEY_SECRETS
        for secret in (TOKEN, *KEY_SECRETS):
            assert secret not in stored and secret not in everything


def _paths(leader: Leader, user_id: str) -> list[str]:
    return sorted(m["path"] for m in admin(leader, "GET", f"/api/v1/users/{user_id}")[1].get("memberships", []))


def _find(leader: Leader, email: str) -> dict:
    status, _, found = scim(leader, "GET", f"/Users?filter=userName%20eq%20%22{email}%22", token=TOKEN)
    assert status == 200 and found["totalResults"] == 1, found
    return found["Resources"][0]


def test_what_providers_send_beside_the_core_is_taken_and_a_patch_that_reaches_nothing_is_refused(
    leader: Leader,
) -> None:
    body = new_user("dee@example.com", "Dee Dee")
    body["schemas"].append(ENTERPRISE)
    body[ENTERPRISE] = {"department": "research"}
    status, _, dee = scim(leader, "POST", "/Users", body, TOKEN)
    assert status == 201, dee
    status, _, dee = scim(
        leader,
        "PATCH",
        f"/Users/{dee['id']}",
        patch(
            {"op": "Add", "path": f"{ENTERPRISE}:department", "value": "eng"},
            {"op": "Replace", "path": "externalId", "value": "ext-dee"},
        ),
        TOKEN,
    )
    assert status == 200 and dee["externalId"] == "ext-dee"
    status, _, refused = scim(
        leader,
        "PATCH",
        f"/Users/{dee['id']}",
        patch({"op": "Replace", "path": 'emails[type eq "home"].value', "value": "x@example.com"}),
        TOKEN,
    )
    assert status == 400 and refused["schemas"] == [ERROR_SCHEMA] and refused["scimType"] == "noTarget"
    status, _, refused = scim(leader, "POST", "/Users", {"schemas": [USER_SCHEMA], "active": True}, TOKEN)
    assert status == 400 and "userName" in refused["detail"]


def test_a_deactivated_person_stays_refused_across_a_restart(leader: Leader, tree: dict[str, str]) -> None:
    eve = scim(leader, "POST", "/Users", new_user("eve@example.com"), TOKEN)[2]
    assert (
        admin(leader, "POST", f"/api/v1/users/{eve['id']}/memberships", {"target": "project:acme/ops/batch"})[0] == 200
    )
    status, key = admin(
        leader, "POST", "/api/v1/keys", {"name": "eve's", "project": "acme/ops/batch", "user": eve["id"]}
    )
    assert status == 201, key
    assert (
        scim(leader, "PATCH", f"/Users/{eve['id']}", patch({"op": "replace", "value": {"active": False}}), TOKEN)[0]
        == 200
    )
    again = leader.restart()  # raises if the leader did not stop cleanly
    try:
        assert http("GET", f"{again.url}/v1/models", key=key["secret"])[0] == 401
        status, person = admin(again, "GET", "/api/v1/users/eve@example.com")
        assert person["state"] == "disabled" and [m["path"] for m in person["memberships"]] == ["acme/ops/batch"]
        assert (
            scim(again, "PATCH", f"/Users/{eve['id']}", patch({"op": "replace", "value": {"active": True}}), TOKEN)[0]
            == 200
        )
        assert http("GET", f"{again.url}/v1/models", key=key["secret"])[0] == 200
    finally:
        again.stop()
