"""SCIM as Entra ID, JumpCloud, Keycloak and Okta call it: userNames that are not addresses, capitalised and path-less
PATCH operations, the filters and pages they ask for, and every refusal a SCIM error, audited, nothing changed."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.control.scim_support import (
    ERROR_SCHEMA,
    GROUP_SCHEMA,
    USER_SCHEMA,
    admin,
    call,
    new_user,
    patch,
    scim,
)
from tests.support.inprocess import InProcessLeader as Leader

TOKEN = "scim-providers-3a9f1c2e8b7d"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    running = Leader(tmp_path_factory.mktemp("scim-providers") / "leader")
    try:
        assert admin(running, "PUT", "/api/v1/auth/secrets/scim-token", {"value": TOKEN})[0] == 200
        yield running
    finally:
        running.stop()


def _entra_user(user_name: str, email: str, external_id: str) -> dict:
    """A user as Entra ID provisions one: userName its UPN or a login, the address in emails, active as text later."""
    return {
        "schemas": [USER_SCHEMA, "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"],
        "externalId": external_id,
        "userName": user_name,
        "active": True,
        "displayName": "Jane Doe",
        "emails": [{"primary": True, "type": "work", "value": email}],
        "name": {"formatted": "Jane Doe", "familyName": "Doe", "givenName": "Jane"},
        "title": "Engineer",
        "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "Research"},
    }


def test_a_user_name_that_is_not_an_address_is_taken_and_the_email_comes_from_emails(leader: Leader) -> None:
    status, _, jdoe = scim(leader, "POST", "/Users", _entra_user("jdoe", "jdoe@example.com", "ext-jdoe"), TOKEN)
    assert status == 201, jdoe
    assert (jdoe["userName"], jdoe["emails"][0]["value"], jdoe["title"]) == ("jdoe", "jdoe@example.com", "Engineer")
    status, person = admin(leader, "GET", f"/api/v1/users/{jdoe['id']}")
    assert status == 200 and (person["email"], person["name"]) == ("jdoe@example.com", "Jane Doe")
    for query in ('userName eq "JDOE"', 'externalId eq "ext-jdoe"', 'emails.value eq "jdoe@example.com"'):
        status, _, found = scim(leader, "GET", f"/Users?filter={_quote(query)}", token=TOKEN)
        assert status == 200 and [u["id"] for u in found["Resources"]] == [jdoe["id"]], (query, found)
    # The primary address wins over the first one.
    body = new_user("kay")
    body["emails"] = [{"value": "kay.home@example.net"}, {"value": "kay@example.com", "primary": True}]
    status, _, kay = scim(leader, "POST", "/Users", body, TOKEN)
    assert status == 201 and admin(leader, "GET", f"/api/v1/users/{kay['id']}")[1]["email"] == "kay@example.com"


def test_a_user_with_no_address_anywhere_is_refused_naming_emails_and_the_list_still_answers(leader: Leader) -> None:
    before = scim(leader, "GET", "/Users", token=TOKEN)[2]["totalResults"]
    status, headers, refused = scim(leader, "POST", "/Users", {"schemas": [USER_SCHEMA], "userName": "nomail"}, TOKEN)
    assert status == 400 and headers["content-type"].startswith("application/scim+json")
    assert refused["schemas"] == [ERROR_SCHEMA] and refused["status"] == "400" and refused["scimType"] == "invalidValue"
    assert refused["detail"].startswith("emails:") and "userName 'nomail'" in refused["detail"]
    status, _, listed = scim(leader, "GET", "/Users", token=TOKEN)
    assert status == 200 and listed["totalResults"] == before
    rows = admin(leader, "GET", "/api/v1/audit?actor=scim&limit=1000")[1]
    assert any(r["action"] == "POST /scim/v2/Users" and r["status"] == 400 for r in rows)


def test_entra_style_patches_apply(leader: Leader) -> None:
    jdoe = _one(leader, 'userName eq "jdoe"')
    ops = patch(
        {"op": "Replace", "path": "active", "value": "False"},
        {"op": "Replace", "path": 'emails[type eq "work"].value', "value": "jane.doe@example.com"},
        {"op": "Add", "path": "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:department", "value": "Ops"},
    )
    status, _, changed = scim(leader, "PATCH", f"/Users/{jdoe['id']}", ops, TOKEN)
    assert status == 200 and changed["active"] is False, changed
    person = admin(leader, "GET", f"/api/v1/users/{jdoe['id']}")[1]
    assert (person["state"], person["email"]) == ("disabled", "jane.doe@example.com")
    ops = patch({"op": "Replace", "value": {"active": "True", "displayName": "Jane D.", "name.givenName": "Janet"}})
    status, _, changed = scim(leader, "PATCH", f"/Users/{jdoe['id']}", ops, TOKEN)
    assert status == 200 and changed["active"] is True and changed["name"]["givenName"] == "Janet", changed
    assert admin(leader, "GET", f"/api/v1/users/{jdoe['id']}")[1]["name"] == "Jane D."
    # Entra's group pushes: add and remove members by filter, with capitalised ops; a rename without a path.
    kay = _one(leader, 'userName eq "kay"')
    status, _, group = scim(
        leader, "POST", "/Groups", {"schemas": [GROUP_SCHEMA], "displayName": "Sales", "externalId": "g-1"}, TOKEN
    )
    assert status == 201 and group.get("members") is None
    ops = patch({"op": "Add", "path": "members", "value": [{"value": jdoe["id"]}, {"value": kay["id"]}]})
    assert len(scim(leader, "PATCH", f"/Groups/{group['id']}", ops, TOKEN)[2]["members"]) == 2
    ops = patch(
        {"op": "Remove", "path": f'members[value eq "{jdoe["id"]}"]'},
        {"op": "Replace", "value": {"displayName": "Sales EMEA"}},
    )
    status, _, group = scim(leader, "PATCH", f"/Groups/{group['id']}", ops, TOKEN)
    assert (
        status == 200 and group["displayName"] == "Sales EMEA" and [m["value"] for m in group["members"]] == [kay["id"]]
    )
    by_external_id = _quote('externalId eq "g-1"')
    status, _, found = scim(leader, "GET", f"/Groups?filter={by_external_id}", token=TOKEN)
    assert [g["id"] for g in found["Resources"]] == [group["id"]]


def test_pages_follow_start_index_and_count(leader: Leader) -> None:
    for n in range(3):
        assert scim(leader, "POST", "/Users", new_user(f"page{n}@example.com"), TOKEN)[0] == 201
    status, _, everyone = scim(leader, "GET", "/Users", token=TOKEN)
    status, _, page = scim(leader, "GET", "/Users?startIndex=2&count=2", token=TOKEN)
    assert status == 200 and (page["startIndex"], page["itemsPerPage"]) == (2, 2)
    assert page["totalResults"] == everyone["totalResults"]
    assert [u["id"] for u in page["Resources"]] == [u["id"] for u in everyone["Resources"][1:3]]
    status, _, bad = scim(leader, "GET", "/Users?count=many", token=TOKEN)
    assert status == 400 and bad["schemas"] == [ERROR_SCHEMA] and "count" in bad["detail"]


def test_an_unknown_path_or_method_is_a_scim_error(leader: Leader) -> None:
    for method, path in (("GET", "/Nope"), ("GET", ""), ("POST", "/Users/x/y"), ("GET", "/Bulk")):
        status, headers, body = scim(leader, method, path, {} if method == "POST" else None, TOKEN)
        assert status == 404 and headers["content-type"].startswith("application/scim+json"), (path, body)
        assert body["schemas"] == [ERROR_SCHEMA] and body["status"] == "404" and "/Users" in body["detail"]
    status, headers, body = scim(leader, "DELETE", "/Users", token=TOKEN)
    assert status == 405 and body["schemas"] == [ERROR_SCHEMA] and "GET, POST" in body["detail"]


def test_a_wrong_token_is_refused_audited_and_changes_nothing(leader: Leader) -> None:
    people = admin(leader, "GET", "/api/v1/users")[1]
    kay = _one(leader, 'userName eq "kay"')
    for token in (None, "not-the-token"):
        status, headers, body = scim(
            leader, "PATCH", f"/Users/{kay['id']}", patch({"op": "replace", "path": "active", "value": False}), token
        )
        assert status == 401 and body["schemas"] == [ERROR_SCHEMA] and body["status"] == "401"
        assert headers["www-authenticate"].startswith("Bearer")
        status, _, body = scim(leader, "POST", "/Users", new_user("intruder@example.com"), token)
        assert status == 401
    status, _, body = call("GET", f"{leader.url}/scim/v2/Nope", token="not-the-token")
    assert status == 401 and body["schemas"] == [ERROR_SCHEMA]
    assert admin(leader, "GET", "/api/v1/users")[1] == people
    rows = admin(leader, "GET", "/api/v1/audit?actor=scim&limit=1000")[1]
    refused = [r for r in rows if r["status"] == 401]
    assert {r["action"] for r in refused} == {f"PATCH /scim/v2/Users/{kay['id']}", "POST /scim/v2/Users"}
    assert len(refused) == 4 and all("not-the-token" not in r["detail"] for r in refused)


def _one(leader: Leader, query: str) -> dict:
    status, _, found = scim(leader, "GET", f"/Users?filter={_quote(query)}", token=TOKEN)
    assert status == 200 and found["totalResults"] == 1, found
    return found["Resources"][0]


def _quote(text: str) -> str:
    return quote(text)
