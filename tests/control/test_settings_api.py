"""``/api/v1/settings`` on a leader built in the test's process: versions on a base, 409 on a stale one, 400 naming the
line, history, rollback; and a change in force within two seconds on another leader of the same store (an ``opod up``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from opod.store import Store
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import Leader as OpodUp
from tests.support.opod_process import http, wait_until

BODY_1 = "prices:\n  '*': {input_per_million: 1, output_per_million: 2}\n"
BODY_2 = "prices:\n  '*': {input_per_million: 3}\nwebhooks:\n  - url: https://hooks.example.com/x\n    secret: hunter2-webhook-secret\n"


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store the module's leader keeps, named so a second leader can share it."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'opod.db'}"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory, database: str) -> Iterator[Leader]:
    up = Leader(
        tmp_path_factory.mktemp("settings") / "home",
        env={"OPOD_PROMETHEUS_URL": "http://127.0.0.1:9999", "OPOD_DATABASE_URL": database},
    )
    yield up
    up.stop()


def put(leader: Leader, body: dict, actor: str = "alice") -> tuple[int, dict]:
    return http_actor("PUT", leader, "/api/v1/settings", body, actor)


def http_actor(method: str, leader: Leader, path: str, body: dict, actor: str) -> tuple[int, dict]:
    """A change sent as ``actor`` (``X-Llmgw-Actor``), as opod ctl sends it."""
    return leader.admin(method, path, body, headers={"X-Llmgw-Actor": actor})


def test_the_settings_as_an_operator_sees_them_through_a_change(leader: Leader) -> None:
    status, empty = leader.admin("GET", "/api/v1/settings")
    assert status == 200
    assert empty == {"version": 0, "body": "", "local_keys": ["prometheus.url"]}

    status, first = put(leader, {"base": 0, "body": BODY_1, "note": "first prices"})
    assert status == 200, first
    assert (first["version"], first["body"], first["note"], first["by"]) == (1, BODY_1, "first prices", "alice")
    assert first["local_keys"] == ["prometheus.url"] and first["at"]

    status, second = put(leader, {"base": 1, "body": BODY_2}, actor="bob")
    assert status == 200, second
    assert second["version"] == 2 and "note" not in second  # absent, never null

    status, newest = leader.admin("GET", "/api/v1/settings")
    assert status == 200 and (newest["version"], newest["body"], newest["by"]) == (2, BODY_2, "bob")
    status, old = leader.admin("GET", "/api/v1/settings?version=1")
    assert status == 200 and old["body"] == BODY_1

    # a writer who read version 1 is told which version to read again; nothing is written
    status, stale = put(leader, {"base": 1, "body": BODY_2}, actor="carol")
    assert status == 409, stale
    assert "version 2" in stale["error"] and "base" in stale["error"]

    # an invalid body is refused whole, with its line and field
    status, invalid = put(
        leader, {"base": 2, "body": "prices: {}\nbudgets:\n  - scope: org:acme\n    period: year\n    micros: 1\n"}
    )
    assert status == 400
    assert "line 4: budgets[0].period: must be day, week or month" in invalid["error"]
    status, unknown = put(
        leader, {"base": 2, "body": "prometheus: {address: x}\nauth: {scim_token: hunter2-webhook-secret}\n"}
    )
    assert status == 400 and "line 1: prometheus.address" in unknown["error"]
    status, scope = put(leader, {"base": 2, "body": "budgets:\n  - scope: team:acme\n    micros: 5\n"})
    assert status == 400 and "line 2: budgets[0].scope: 'team:acme' is not a team path" in scope["error"]
    assert leader.admin("GET", "/api/v1/settings")[1]["version"] == 2

    # history, newest first; the spec types limit as a string
    status, history = leader.admin("GET", "/api/v1/settings/history")
    assert status == 200 and [v["version"] for v in history] == [2, 1]
    status, history = leader.admin("GET", "/api/v1/settings/history?limit=1")
    assert status == 200 and [v["version"] for v in history] == [2]
    status, bad = leader.admin("GET", "/api/v1/settings/history?limit=lots")
    assert status == 400 and "limit" in bad["error"]

    # a rollback writes the old body as a new version; history keeps every version
    status, rolled = http_actor("POST", leader, "/api/v1/settings/rollback", {"version": 1}, "dave")
    assert status == 200, rolled
    assert (rolled["version"], rolled["body"], rolled["by"], rolled["note"]) == (
        3,
        BODY_1,
        "dave",
        "rollback to version 1",
    )
    assert [v["version"] for v in leader.admin("GET", "/api/v1/settings/history")[1]] == [3, 2, 1]

    status, missing = leader.admin("POST", "/api/v1/settings/rollback", {"version": 42})
    assert status == 404 and "42" in missing["error"]
    status, missing = leader.admin("GET", "/api/v1/settings?version=42")
    assert status == 404
    status, bad = leader.admin("GET", "/api/v1/settings?version=newest")
    assert status == 400 and "version" in bad["error"]

    # each change is in the audit with its actor; the body (and the secret in it) is not
    status, audit = leader.admin("GET", "/api/v1/audit?contains=settings")
    assert status == 200
    kept = [(e["actor"], e["action"], e["status"]) for e in audit]
    assert ("alice", "PUT /api/v1/settings", 200) in kept and ("bob", "PUT /api/v1/settings", 200) in kept
    assert ("carol", "PUT /api/v1/settings", 409) in kept
    assert ("dave", "POST /api/v1/settings/rollback", 200) in kept
    assert "hunter2-webhook-secret" not in json.dumps(audit)


def test_a_body_that_is_not_settings_text_is_refused(leader: Leader) -> None:
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": 7})
    assert status == 400 and "body" in answer["error"]
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0})
    assert status == 400 and "body" in answer["error"]


def test_numbers_beyond_a_version_are_refused_by_name(leader: Leader) -> None:
    status, answer = leader.admin("POST", "/api/v1/settings/rollback", {"version": 2**63})
    assert status == 400 and "version" in answer["error"]
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 2**63 - 1, "body": ""})
    assert status == 400 and "base" in answer["error"]
    status, answer = leader.admin("GET", f"/api/v1/settings?version={2**64}")
    assert status == 400 and "version" in answer["error"]


def test_a_change_is_in_force_on_another_leader_of_the_same_store_within_two_seconds(
    leader: Leader, database: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    second = OpodUp(
        tmp_path_factory.mktemp("second") / "home",
        worker=False,
        extra=["--no-default-models"],
        # Leaders of one store share the key its secrets are sealed with.
        env={"OPOD_DATABASE_URL": database, "OPOD_SECRETS_KEY_FILE": str(leader.home / "secrets.key")},
    )
    try:

        def in_force(on: Leader | OpodUp) -> int:
            status, headers, _ = http("GET", on.admin_url + "/api/v1/settings", key=on.key)
            assert status == 200
            return int(headers["x-opod-settings-in-force"])

        newest = leader.admin("GET", "/api/v1/settings")[1]["version"]
        assert in_force(second) == newest  # read at start
        status, written = leader.admin("PUT", "/api/v1/settings", {"base": newest, "body": BODY_2})
        assert status == 200, written
        written_at = time.monotonic()
        assert in_force(leader) == newest + 1  # at once on the leader that took it
        wait_until(
            lambda: in_force(second) == newest + 1, 2.0, "the new version in force on the second leader", interval=0.05
        )
        assert time.monotonic() - written_at < 2.0
        assert second.admin("GET", "/api/v1/settings")[1]["local_keys"] == []  # the first leader's override is its own
    finally:
        second.process.stop()


def test_a_version_written_through_another_handle_on_the_store_takes_effect_here(leader: Leader, database: str) -> None:
    newest = leader.admin("GET", "/api/v1/settings")[1]["version"]
    assert leader.admin("GET", "/api/v1/auth")[1]["signup_open"] is False
    with Store.open(database) as other:  # as another leader, or a restore script, writes it
        other.put_settings(newest, "auth:\n  signup_open: true\n  base_url: https://llm.example.com\n", by="elsewhere")
    wait_until(lambda: leader.admin("GET", "/api/v1/auth")[1]["signup_open"] is True, 3.0, "sign-up open on the leader")
    response = leader.request("GET", "/api/v1/settings")
    assert int(response.headers["x-opod-settings-in-force"]) == newest + 1
