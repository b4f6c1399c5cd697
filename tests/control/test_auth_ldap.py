"""``POST /api/v1/auth/ldap/test`` and ``auth.ldap`` in ``GET /api/v1/auth``, against a real slapd.

Trying a block answers each step as a ``CheckView`` (settings, connect, starttls, service_bind, user_search,
group_search) and changes nothing: no person, no setting, no secret; the call is audited by its actor. The answers
are checked against the spec's own schemas, keys and types, no ``null``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.ports import free_port
from tests.control.scim_support import admin
from tests.support import slapd
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until

if slapd.binary() is None:
    pytest.skip(f"no slapd here: {slapd.INSTALL}", allow_module_level=True)
SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
if not SPEC_PATH.is_file():
    pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})", allow_module_level=True)
SCHEMAS = json.loads(SPEC_PATH.read_text())["components"]["schemas"]

PASSWORD = "ada-pw-31"
TREE = "\n".join([slapd.person("ada", "Ada Lovelace", password=PASSWORD), slapd.group("admins", ["ada"])])


def block(url: str, *, extra: str = "") -> str:
    """An auth.ldap block as the request's settings carry it."""
    return (
        f"urls: [{url}]\nbase_dn: {slapd.SUFFIX}\nbind_dn: {slapd.SERVICE}\n"
        f"user_filter: (objectClass=inetOrgPerson)\nroles: {{admins: admin}}\ntimeout: 2s\nlabel: Example\n{extra}"
    )


def conforms(value: Any, schema: dict[str, Any], where: str = "body") -> None:
    """``value`` is what ``schema`` (the spec's) allows: its types, only its keys, never null."""
    if "$ref" in schema:
        conforms(value, SCHEMAS[schema["$ref"].rsplit("/", 1)[1]], where)
        return
    assert value is not None, f"{where} is null"
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), f"{where} is not an object"
        properties = schema.get("properties", {})
        assert set(value) <= set(properties), f"{where} has keys the spec lacks: {set(value) - set(properties)}"
        for key, item in value.items():
            conforms(item, properties[key], f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), f"{where} is not an array"
        for index, item in enumerate(value):
            conforms(item, schema["items"], f"{where}[{index}]")
    elif kind is not None:
        python = {"string": str, "boolean": bool, "integer": int, "number": (int, float)}[kind]
        assert isinstance(value, python) and (kind != "integer" or not isinstance(value, bool)), f"{where}: {value!r}"


def try_block(leader: Leader, body: dict[str, Any], actor: str = "alice") -> dict[str, Any]:
    status, answer = admin(leader, "POST", "/api/v1/auth/ldap/test", body, actor=actor)
    assert status == 200, answer
    conforms(answer, {"$ref": "#/components/schemas/LDAPTestView"})
    return dict(answer)


def steps(answer: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    return {c["step"]: (c["ok"], c["detail"]) for c in answer["checks"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slapd.Slapd]:
    running = slapd.Slapd(tmp_path_factory.mktemp("slapd"), TREE)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("auth-ldap") / "leader")
    yield up
    up.stop()


def state(leader: Leader) -> tuple[Any, ...]:
    """What a test of a block must not change: people, settings, the auth view, the secrets kept."""
    return (
        admin(leader, "GET", "/api/v1/users"),
        admin(leader, "GET", "/api/v1/settings"),
        admin(leader, "GET", "/api/v1/auth"),
        leader.call(leader.leader.control.secrets.named("store:auth/ldap-bind")),
    )


def test_a_good_block_passes_every_step_with_the_password_sent_and_changes_nothing(
    leader: Leader, server: slapd.Slapd
) -> None:
    before = state(leader)
    answer = try_block(leader, {"settings": block(server.url), "password": slapd.SERVICE_PASSWORD})
    assert answer["ok"] is True, answer
    assert [c["step"] for c in answer["checks"]] == [
        "settings",
        "connect",
        "starttls",
        "service_bind",
        "user_search",
        "group_search",
    ]
    found = steps(answer)
    assert found["connect"][1] == f"{server.url} answered"
    assert found["service_bind"][1] == f"bound as {slapd.SERVICE}"
    assert found["user_search"][1].startswith("1 people under dc=example,dc=org match")
    assert "every group the settings name is there (1)" in found["group_search"][1]
    assert state(leader) == before
    assert "ldap" not in before[2][1], "no auth.ldap in force: GET /auth says nothing of LDAP"


def test_a_wrong_service_password_fails_the_bind_step(leader: Leader, server: slapd.Slapd) -> None:
    answer = try_block(leader, {"settings": block(server.url), "password": "not-the-password"})
    assert answer["ok"] is False
    assert steps(answer)["service_bind"] == (
        False,
        f"{server.url} refused the bind as {slapd.SERVICE}: invalidCredentials",
    )
    assert "user_search" not in steps(answer), "the steps after a failed one are not tried"
    answer = try_block(leader, {"settings": block(server.url)})  # none sent and none kept
    assert steps(answer)["service_bind"][0] is False
    assert "send password, or keep it with PUT /api/v1/auth/secrets/ldap-bind" in steps(answer)["service_bind"][1]


def test_bad_settings_are_refused_naming_the_line_and_the_field(leader: Leader, server: slapd.Slapd) -> None:
    answer = try_block(leader, {"settings": "urls: [http://127.0.0.1:389]\nbase_dn: dc=x\nstart_tls: maybe\n"})
    assert answer == {
        "ok": False,
        "checks": [
            {
                "step": "settings",
                "ok": False,
                "detail": "line 1: auth.ldap.urls: 'http://127.0.0.1:389' is not a directory address; write "
                "ldap://HOST:389 or ldaps://HOST:636; line 3: auth.ldap.start_tls: input should be a valid boolean, "
                "unable to interpret input",
            }
        ],
    }
    answer = try_block(leader, {"settings": block(server.url, extra="bind_password: hunter2\n")})
    assert "auth.ldap.bind_password: name a stored secret as store:NAME" in steps(answer)["settings"][1]
    answer = try_block(leader, {"settings": block(server.url, extra="memberships: [{group: admins, target: 'org:'}]")})
    assert steps(answer)["settings"][0] is False and "memberships[0].target" in steps(answer)["settings"][1]
    answer = try_block(leader, {"settings": "urls: [ldap://x\n"})
    assert steps(answer)["settings"][1].startswith("line 2: not valid YAML")


def test_what_the_directory_lacks_and_a_server_that_does_not_answer_fail_their_steps(
    leader: Leader, server: slapd.Slapd
) -> None:
    lacking = block(server.url, extra="memberships: [{group: ml, target: 'team:acme/ml'}]\n")
    answer = try_block(leader, {"settings": lacking, "password": slapd.SERVICE_PASSWORD})
    assert steps(answer)["mappings"] == (
        False,
        "auth.ldap.memberships[0].target: no team 'team:acme/ml': there is no organization 'acme'; "
        "GET /api/v1/orgs lists the tree; group ml grants nothing until it does",
    )
    assert steps(answer)["group_search"][0] is False
    assert steps(answer)["group_search"][1].endswith("the settings name groups the directory lacks: ml")
    nobody = block(server.url).replace("(objectClass=inetOrgPerson)", "(objectClass=device)")
    answer = try_block(leader, {"settings": nobody, "password": slapd.SERVICE_PASSWORD})
    assert (
        steps(answer)["user_search"][0] is False and "check base_dn and user_filter" in steps(answer)["user_search"][1]
    )
    closed = f"ldap://127.0.0.1:{free_port()}"
    answer = try_block(leader, {"settings": block(closed), "password": slapd.SERVICE_PASSWORD})
    assert answer["ok"] is False and steps(answer)["connect"][1].startswith(f"no LDAP server answered: {closed}")
    answer = try_block(leader, {"settings": block(f"{closed}, {server.url}"), "password": slapd.SERVICE_PASSWORD})
    assert answer["ok"] is True and steps(answer)["connect"][1].startswith(f"{server.url} answered ({closed}:")


def test_every_try_is_audited_by_its_actor_and_the_password_is_not_kept(leader: Leader, server: slapd.Slapd) -> None:
    try_block(leader, {"settings": block(server.url), "password": slapd.SERVICE_PASSWORD}, actor="mallory")
    status, rows = admin(leader, "GET", "/api/v1/audit?limit=10000")
    assert status == 200
    tries = [r for r in rows if r["action"] == "POST /api/v1/auth/ldap/test"]
    assert tries and tries[0]["actor"] == "mallory" and tries[0]["status"] == 200
    assert slapd.SERVICE_PASSWORD not in json.dumps(rows)


def test_the_block_in_force_shows_in_get_auth_with_its_last_sync_and_why_it_is_off(
    leader: Leader, server: slapd.Slapd
) -> None:
    body = "auth:\n  ldap:\n" + "".join(f"    {line}\n" for line in block(server.url).splitlines())
    status, answer = admin(leader, "PUT", "/api/v1/settings", {"base": 0, "body": body})
    assert status == 200, answer

    def ldap() -> dict[str, Any]:
        status, view = admin(leader, "GET", "/api/v1/auth")
        assert status == 200
        conforms(view, {"$ref": "#/components/schemas/AuthView"})
        return dict(view["ldap"])

    # The password is not kept yet: the leader's first read of the directory says so.
    wait_until(lambda: "off" in ldap(), 20, "auth.ldap to say why it is off")
    assert ldap()["off"] == (
        "the service account's password is not stored (store:auth/ldap-bind): "
        "PUT /api/v1/auth/secrets/ldap-bind keeps it"
    )
    assert ldap()["last_sync"]["error"] == ldap()["off"]
    answer = try_block(leader, {})  # the block in force, its password not kept
    assert steps(answer)["settings"] == (True, "the auth.ldap in force") and answer["ok"] is False

    assert admin(leader, "PUT", "/api/v1/auth/secrets/ldap-bind", {"value": slapd.SERVICE_PASSWORD})[0] == 200
    assert try_block(leader, {})["ok"] is True
    leader.call(leader.leader.control.directory.sync())
    view = ldap()
    at = view["last_sync"].pop("at")
    assert view == {
        "urls": [server.url],
        "base_dn": slapd.SUFFIX,
        "bind_dn": slapd.SERVICE,
        "label": "Example",
        "last_sync": {"people": 1, "accounts": 1, "suspended": 0, "reinstated": 0, "roles_changed": 1},
    }
    assert at.endswith("Z") or "+00:00" in at
    status, people = admin(leader, "GET", "/api/v1/users")
    assert [(p["email"], p["role"]) for p in people] == [("ada@example.org", "admin")]


def test_the_leader_reads_the_directory_again_on_the_interval(leader: Leader, server: slapd.Slapd) -> None:
    status, current = admin(leader, "GET", "/api/v1/settings")
    assert status == 200
    body = "auth:\n  ldap:\n" + "".join(
        f"    {line}\n" for line in block(server.url, extra="sync_interval: 1s").splitlines()
    )
    assert admin(leader, "PUT", "/api/v1/settings", {"base": current["version"], "body": body})[0] == 200

    def last_at() -> str:
        return str(admin(leader, "GET", "/api/v1/auth")[1]["ldap"]["last_sync"]["at"])

    seen: set[str] = set()

    def syncs() -> int:
        seen.add(last_at())
        return len(seen)

    # The one before, the one the changed block asks for at once, then one a second later: the interval's.
    wait_until(lambda: syncs() >= 3, 10, "the directory read again each second")
