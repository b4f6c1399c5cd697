"""Sign-in and group sync against a real OpenLDAP server (Debian's slapd), on a leader built in the test's process.

The directory: ada (admins, ml), bob (ml), cyd (operators, chat-leads), eve (no group) and nomail (no e-mail);
``auth.ldap`` maps admins and operators to roles, ml to the team acme/ml and chat-leads to managers of the project
acme/ml/chat. What a person notices is asserted: who signs in, the refusals' words, the account's role and
memberships, a key refused on ``/v1`` while its owner is gone from the directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from opod.access.directory import EMPTY, WRONG, Directory, DirectoryDown, DirectoryRefused, DirectorySync
from opod.store.people import UserRecord
from tests.support import slapd
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, wait_until

if slapd.binary() is None:
    pytest.skip(f"no slapd here: {slapd.INSTALL}", allow_module_level=True)

PASSWORDS = {"ada": "ada-pw-31", "bob": "bob-pw-72", "cyd": "cyd-pw-05", "eve": "eve-pw-44", "nomail": "nm-pw-9"}
TREE = "\n".join(
    [
        slapd.person("ada", "Ada Lovelace", password=PASSWORDS["ada"]),
        slapd.person("bob", "Bob Babbage", password=PASSWORDS["bob"]),
        slapd.person("cyd", "Cyd Charisse", password=PASSWORDS["cyd"]),
        slapd.person("eve", "Eve Online", password=PASSWORDS["eve"]),
        slapd.person("nomail", "No Mail", mail="", password=PASSWORDS["nomail"]),
        slapd.group("admins", ["ada"]),
        slapd.group("operators", ["cyd"]),
        slapd.group("ml", ["ada", "bob"]),
        slapd.group("chat-leads", ["cyd"]),
    ]
)


def settings_body(url: str) -> str:
    return f"""auth:
  ldap:
    urls: [{url}]
    base_dn: {slapd.SUFFIX}
    bind_dn: {slapd.SERVICE}
    user_filter: (objectClass=inetOrgPerson)
    disabled_filter: (employeeType=disabled)
    roles: {{admins: admin, operators: operator}}
    memberships:
      - {{group: ml, target: "team:acme/ml"}}
      - {{group: "cn=chat-leads,ou=groups,{slapd.SUFFIX}", target: "project:acme/ml/chat", role: manager}}
    sync_interval: 1h
    timeout: 2s
    label: Example directory
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slapd.Slapd]:
    running = slapd.Slapd(tmp_path_factory.mktemp("slapd"), TREE)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory, server: slapd.Slapd) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("directory") / "leader")
    try:
        for path, body in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ):
            assert up.admin("POST", path, body)[0] == 201
        status, answer = up.admin("PUT", "/api/v1/auth/secrets/ldap-bind", {"value": slapd.SERVICE_PASSWORD})
        assert status == 200, answer
        status, answer = up.admin("PUT", "/api/v1/settings", {"base": 0, "body": settings_body(server.url)})
        assert status == 200, answer
        # The leader reads the directory once the block is in force; the tests start after that first sync.
        wait_until(lambda: directory(up).view().last_sync is not None, 20, "the first LDAP sync")
        yield up
    finally:
        up.stop()


def directory(leader: Leader) -> Directory:
    return leader.leader.control.directory


def sign_in(leader: Leader, username: str, password: str) -> UserRecord:
    return leader.call(directory(leader).sign_in(username, password))


def refusal(leader: Leader, username: str, password: str) -> str:
    with pytest.raises(DirectoryRefused) as refused:
        sign_in(leader, username, password)
    return refused.value.reason


def sync(leader: Leader) -> DirectorySync:
    return leader.call(directory(leader).sync())


def person(leader: Leader, email: str) -> dict[str, Any]:
    status, body = leader.admin("GET", f"/api/v1/users/{email}")
    assert status == 200, body
    return dict(body)


def places(leader: Leader, email: str) -> dict[str, str]:
    return {m["path"]: m["role"] for m in person(leader, email)["memberships"]}


def test_the_first_sync_made_an_account_for_everyone_with_an_email(leader: Leader) -> None:
    first = directory(leader).view().last_sync
    assert first is not None and first.people == 5 and first.accounts == 4 and first.suspended == 0
    assert first.error is not None and "nomail has no mail: no account" in first.error
    emails = sorted(u["email"] for u in leader.admin("GET", "/api/v1/users")[1])
    assert emails == ["ada@example.org", "bob@example.org", "cyd@example.org", "eve@example.org"]


def test_the_right_password_signs_in_with_the_role_and_places_the_groups_give(leader: Leader) -> None:
    ada = sign_in(leader, "ada", PASSWORDS["ada"])
    assert (ada.email, ada.name, ada.role, ada.state) == ("ada@example.org", "Ada Lovelace", "admin", "active")
    assert places(leader, "ada@example.org") == {"acme/ml": "member"}
    cyd = sign_in(leader, "  CYD ", PASSWORDS["cyd"])  # the login as people type it
    assert cyd.role == "operator" and places(leader, "cyd@example.org") == {"acme/ml/chat": "manager"}
    eve = sign_in(leader, "eve", PASSWORDS["eve"])
    assert eve.role == "" and places(leader, "eve@example.org") == {}


def test_a_wrong_password_and_an_unknown_person_get_the_same_refusal(leader: Leader, server: slapd.Slapd) -> None:
    assert refusal(leader, "ada", "not-her-password") == WRONG
    assert refusal(leader, "nobody", "whatever-1") == WRONG
    assert refusal(leader, "ada)(uid=*", PASSWORDS["ada"]) == WRONG  # a filter in the name matches nobody
    assert person(leader, "ada@example.org")["state"] == "active"


def test_an_empty_password_is_refused_before_anything_reaches_the_directory(
    leader: Leader, server: slapd.Slapd
) -> None:
    binds = server.binds()
    for empty in ("", "   ", "\t\n"):
        assert refusal(leader, "ada", empty) == EMPTY
    assert server.binds() == binds, "an empty password must never be sent to the directory"
    sign_in(leader, "ada", PASSWORDS["ada"])  # the count moves when a password is tried
    assert server.binds(f"uid=ada,ou=people,{slapd.SUFFIX}") >= 1 and server.binds() == binds + 2


def test_a_person_with_no_email_cannot_sign_in_and_is_told_why(leader: Leader) -> None:
    assert refusal(leader, "nomail", PASSWORDS["nomail"]).startswith("the directory has no mail for nomail")


def test_groups_changed_in_the_directory_change_the_role_and_the_places_at_the_next_sign_in(
    leader: Leader, server: slapd.Slapd
) -> None:
    server.modify(slapd.member_change("admins", "add", "bob"))
    server.modify(slapd.member_change("chat-leads", "add", "bob"))
    try:
        bob = sign_in(leader, "bob", PASSWORDS["bob"])
        assert bob.role == "admin"
        assert places(leader, "bob@example.org") == {"acme/ml": "member", "acme/ml/chat": "manager"}
    finally:
        server.modify(slapd.member_change("admins", "delete", "bob"))
        server.modify(slapd.member_change("chat-leads", "delete", "bob"))
    server.modify(slapd.member_change("ml", "delete", "bob"))
    try:
        bob = sign_in(leader, "bob", PASSWORDS["bob"])
        assert bob.role == "" and places(leader, "bob@example.org") == {}
    finally:
        server.modify(slapd.member_change("ml", "add", "bob"))
    assert sync(leader).roles_changed == 0 and places(leader, "bob@example.org") == {"acme/ml": "member"}


def test_a_place_joined_by_hand_outside_the_mappings_is_left_alone(leader: Leader) -> None:
    status, body = leader.admin("POST", "/api/v1/users/eve@example.org/memberships", {"target": "project:acme/ml/chat"})
    assert status == 200, body
    # chat is mapped (chat-leads), so the directory decides it for eve: she is in no such group.
    sync(leader)
    assert places(leader, "eve@example.org") == {}
    status, body = leader.admin("POST", "/api/v1/users/eve@example.org/memberships", {"target": "org:acme"})
    assert status == 200, body
    sync(leader)
    assert places(leader, "eve@example.org") == {"acme": "member"}


def test_a_sync_suspends_who_left_or_was_disabled_and_reinstates_them_when_back(
    leader: Leader, server: slapd.Slapd
) -> None:
    eve = person(leader, "eve@example.org")
    status, key = leader.admin("POST", "/api/v1/keys", {"name": "eve's", "user": eve["id"]})
    assert status == 201, key
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200

    server.modify(f"dn: uid=eve,ou=people,{slapd.SUFFIX}\nchangetype: delete\n")
    done = sync(leader)
    assert (done.people, done.suspended, done.reinstated) == (4, 1, 0)
    assert person(leader, "eve@example.org")["state"] == "disabled"
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 401
    assert refusal(leader, "eve", PASSWORDS["eve"]) == WRONG

    server.modify(slapd.person("eve", "Eve Online", password=PASSWORDS["eve"]))
    done = sync(leader)
    assert (done.people, done.suspended, done.reinstated) == (5, 0, 1)
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200

    server.modify(
        f"dn: uid=eve,ou=people,{slapd.SUFFIX}\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n"
    )
    assert sync(leader).suspended == 1
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 401
    assert "has eve's account disabled" in refusal(leader, "eve", PASSWORDS["eve"])
    server.modify(f"dn: uid=eve,ou=people,{slapd.SUFFIX}\nchangetype: modify\ndelete: employeeType\n")
    assert sign_in(leader, "eve", PASSWORDS["eve"]).state == "active"  # a sign-in reinstates as a sync does
    assert http("GET", f"{leader.url}/v1/models", key=key["secret"])[0] == 200


def test_a_person_whose_email_is_taken_out_keeps_their_account_as_it_was(leader: Leader, server: slapd.Slapd) -> None:
    dn = f"uid=bob,ou=people,{slapd.SUFFIX}"
    server.modify(f"dn: {dn}\nchangetype: modify\ndelete: mail\n")
    try:
        done = sync(leader)
        assert done.suspended == 0 and "bob has no mail: no account" in done.error
        assert person(leader, "bob@example.org")["state"] == "active"
    finally:
        server.modify(f"dn: {dn}\nchangetype: modify\nadd: mail\nmail: bob@example.org\n")


def test_the_changes_are_audited_as_the_directorys(leader: Leader) -> None:
    status, rows = leader.admin("GET", "/api/v1/audit?limit=10000")
    assert status == 200
    ours = [r for r in rows if r["actor"] == "ldap"]
    assert {r["action"] for r in ours} == {"LDAP sync", "LDAP sign-in"}
    assert all(r["source"] == "leader" and r["target"].startswith("user:") for r in ours)
    assert not any(p in str(rows) for p in PASSWORDS.values())


def test_with_the_directory_down_sign_in_says_so_and_the_view_says_why(leader: Leader, server: slapd.Slapd) -> None:
    server.stop()
    try:
        with pytest.raises(DirectoryDown) as down:
            sign_in(leader, "ada", PASSWORDS["ada"])
        assert down.value.reason.startswith(f"no LDAP server answered: {server.url}")
        off = directory(leader).view().off
        assert off is not None and off.startswith("no LDAP server answered")
        done = sync(leader)
        assert done.error.startswith("no LDAP server answered") and done.suspended == 0
        assert person(leader, "ada@example.org")["state"] == "active", "a directory that is down suspends nobody"
        assert refusal(leader, "ada", "") == EMPTY  # still refused first, whatever the directory's state
    finally:
        server.start()
    assert "no LDAP server" not in sync(leader).error
    assert directory(leader).view().off is None
    assert sign_in(leader, "ada", PASSWORDS["ada"]).role == "admin"
