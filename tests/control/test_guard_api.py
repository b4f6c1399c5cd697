"""``/api/v1/guard`` on one real leader: the settings' guard policies as an operator reads them, attaching them to
a project (by path and by ID), a team, a person or a key and taking them off, the refusals (an ``ErrorView`` naming the
field), the audit of each change, what the guards did (counted and listed from the requests' records), and the
attachments kept across a restart and followed from another handle on the same store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from opod.store import Store
from opod.store.usage import NewUsage
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until
from tests.support.rows import usage_row

SETTINGS = (
    "guard:\n"
    "  default: [pii]\n"
    "  policies:\n"
    "    - name: pii\n"
    "      mode: shadow\n"
    "      checks:\n"
    "        - {reads: both, pii: email, action: redact}\n"
    "        - {pii: card}\n"
    "    - name: secrets\n"
    "      fail: open\n"
    "      no_store: true\n"
    "      checks:\n"
    "        - {pattern: 'sk-[A-Za-z0-9]+', name: api-key, category: leaked_secret}\n"
)
ACTOR = "guard-ops"


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store the module's leader keeps, named so another handle can share it."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'opod.db'}"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory, database: str) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("guard") / "home", env={"OPOD_DATABASE_URL": database})
    status, body = up.admin("PUT", "/api/v1/settings", {"base": 0, "body": SETTINGS})
    assert status == 200, body
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("/api/v1/projects", {"name": "search", "in": "acme/ml"}),
    ):
        status, made = up.admin("POST", path, body)
        assert status == 201, made
    yield up
    up.stop()


def send(leader: Leader, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    return leader.admin(method, path, body, headers={"X-Llmgw-Actor": ACTOR})


def ok(leader: Leader, method: str, path: str, body: object | None = None) -> dict:
    status, answer = send(leader, method, path, body)
    assert status == 200, (method, path, status, answer)
    assert isinstance(answer, dict)
    return answer


def refused(leader: Leader, method: str, path: str, body: object | None, status: int) -> str:
    got, answer = send(leader, method, path, body)
    assert got == status, (method, path, got, answer)
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    return answer["error"]


def project_id(leader: Leader, path: str) -> str:
    status, orgs = leader.admin("GET", "/api/v1/orgs")
    assert status == 200 and isinstance(orgs, list)
    return next(p["id"] for o in orgs for t in o["teams"] for p in t["projects"] if p["path"] == path)


def attachments(leader: Leader) -> list[dict]:
    return ok(leader, "GET", "/api/v1/guard")["attachments"]


def detach_all(leader: Leader) -> None:
    for a in attachments(leader):
        ok(
            leader,
            "DELETE",
            "/api/v1/guard/attachments",
            {"target": f"{a['Scope']}:{a['ScopeID']}", "policy": a["Policy"]},
        )


def test_the_library_shows_the_settings_policies_and_what_each_looks_for(leader: Leader) -> None:
    detach_all(leader)
    assert ok(leader, "GET", "/api/v1/guard") == {
        "enabled": True,
        "policies": ["pii", "secrets"],
        "default": ["pii"],
        "attachments": [],
        "details": [
            {
                "name": "pii",
                "mode": "shadow",
                "fail": "closed",
                "no_store": False,
                "checks": ["both: pii email → redact", "input: pii card → block"],
            },
            {
                "name": "secrets",
                "mode": "enforce",
                "fail": "open",
                "no_store": True,
                "checks": ["input: pattern api-key → block"],
            },
        ],
    }


def test_a_policy_attached_to_a_project_by_path_and_by_id_is_one_attachment(leader: Leader) -> None:
    detach_all(leader)
    chat = project_id(leader, "acme/ml/chat")
    made = ok(leader, "POST", "/api/v1/guard/attachments", {"target": "project:acme/ml/chat", "policy": "secrets"})
    assert made == {"Scope": "project", "ScopeID": chat, "Policy": "secrets"}
    # The same attachment named by the project's ID, or by its path again: answered as it is, nothing added.
    assert ok(leader, "POST", "/api/v1/guard/attachments", {"target": f"project:{chat}", "policy": "secrets"}) == made
    assert (
        ok(leader, "POST", "/api/v1/guard/attachments", {"target": "project:acme/ml/chat", "policy": "secrets"}) == made
    )
    assert attachments(leader) == [{"Scope": "project", "ScopeID": chat, "Policy": "secrets", "name": "acme/ml/chat"}]
    assert leader.leader.guard_attachments.policies_for(project=chat) == ("secrets",)  # what the gateway reads

    status, audit = leader.admin("GET", "/api/v1/audit?contains=guard/attachments")
    assert status == 200 and isinstance(audit, list)
    mine = [a for a in audit if a["actor"] == ACTOR and a["action"] == "POST /api/v1/guard/attachments"]
    assert len(mine) >= 3 and {a["target"] for a in mine} == {f"project:{chat}"}
    assert {a["status"] for a in mine} == {200}


def test_teams_people_and_keys_are_named_as_people_know_them(leader: Leader) -> None:
    detach_all(leader)
    status, person = leader.admin(
        "POST", "/api/v1/accounts", {"email": "ada@example.com", "password": "a long enough password"}
    )
    assert status in (200, 201), person
    status, key = leader.admin("POST", "/api/v1/keys", {"name": "ada's notebook", "project": "acme/ml/search"})
    assert status == 201, key
    for target in ("team:acme/ml", "user:ada@example.com", f"key:{key['id']}"):
        ok(leader, "POST", "/api/v1/guard/attachments", {"target": target, "policy": "pii"})
    assert [(a["Scope"], a["name"]) for a in attachments(leader)] == [
        ("team", "acme/ml"),
        ("user", "ada@example.com"),
        ("key", "ada's notebook"),
    ]
    assert [a["ScopeID"] for a in attachments(leader)][1:] == [person["id"], key["id"]]


def test_a_detach_answers_what_it_took_off_and_one_not_attached_is_404(leader: Leader) -> None:
    detach_all(leader)
    search = project_id(leader, "acme/ml/search")
    ok(leader, "POST", "/api/v1/guard/attachments", {"target": f"project:{search}", "policy": "pii"})
    removed = ok(leader, "DELETE", "/api/v1/guard/attachments", {"target": "project:acme/ml/search", "policy": "pii"})
    assert removed == {"Scope": "project", "ScopeID": search, "Policy": "pii"}
    assert attachments(leader) == [] and leader.leader.guard_attachments.all() == ()
    error = refused(
        leader, "DELETE", "/api/v1/guard/attachments", {"target": "project:acme/ml/search", "policy": "pii"}, 404
    )
    assert "policy 'pii' is not attached to 'project:acme/ml/search'" in error and "GET /api/v1/guard" in error


@pytest.mark.parametrize(
    ("method", "body", "status", "said"),
    [
        ("POST", {"target": "project:acme/ml/chat", "policy": "nope"}, 400, "policy: 'nope' is not a policy of"),
        ("POST", {"target": "project:acme/ml/chat"}, 400, "policy: give the name of a policy"),
        ("POST", {"target": "galaxy:far/away", "policy": "pii"}, 400, "target: 'galaxy:far/away' starts with 'galaxy'"),
        (
            "POST",
            {"target": "project:acme/chat", "policy": "pii"},
            400,
            "target: 'project:acme/chat' is not a project path",
        ),
        ("POST", {"policy": "pii"}, 400, "target: give a scope"),
        ("POST", {"target": "project:acme/ml/nope", "policy": "pii"}, 404, "target: no project 'project:acme/ml/nope'"),
        ("POST", {"target": "key:k_nope", "policy": "pii"}, 404, "target: no API key 'k_nope'"),
        ("POST", {"target": "org:acme", "policy": "pii", "extra": 1}, 400, "extra"),
        ("POST", {"target": 7, "policy": "pii"}, 400, "target"),
        ("DELETE", {"target": "team:acme/nope", "policy": "pii"}, 404, "target: no team 'team:acme/nope'"),
        ("DELETE", {"target": "org:acme", "policy": ""}, 400, "policy: give the name of a policy"),
    ],
)
def test_a_refusal_is_an_error_view_naming_the_field_and_what_to_do(
    leader: Leader, method: str, body: dict, status: int, said: str
) -> None:
    before = attachments(leader)
    assert said in refused(leader, method, "/api/v1/guard/attachments", body, status)
    assert attachments(leader) == before
    status_, audit = leader.admin("GET", "/api/v1/audit?contains=guard/attachments&actor=" + ACTOR)
    assert status_ == 200 and isinstance(audit, list)
    assert any(a["status"] == status and a["action"] == f"{method} /api/v1/guard/attachments" for a in audit)


def usage(entry: str, at: datetime, project: str, **guard: object) -> NewUsage:
    fields = {"request_id": f"req-{entry}", "ts": at, "model": "sim-chat", "project_id": project, "status": 200}
    return usage_row(entry, **(fields | guard))


def test_events_count_what_the_guards_did_and_list_the_requests_they_acted_on(leader: Leader, database: str) -> None:
    chat = project_id(leader, "acme/ml/chat")
    now = datetime.now(UTC)
    with Store.open(database) as other:  # the request records, as the ledger commits them
        other.append_ledger(
            [
                usage("g-plain", now - timedelta(minutes=5), chat),
                # A guardrail webhook that let a request through: counted, never listed among what the guards did.
                usage("g-allow", now - timedelta(seconds=30), chat, guard_action="allow", guard_policy="hook"),
                usage("g-old", now - timedelta(hours=30), chat, guard_action="block", guard_policy="secrets"),
                usage(
                    "g-block",
                    now - timedelta(minutes=3),
                    chat,
                    status=400,
                    guard_action="block",
                    guard_policy="secrets",
                    guard_category="leaked_secret",
                    guard_rule="api-key",
                    guard_ms=2,
                ),
                usage(
                    "g-redact",
                    now - timedelta(minutes=2),
                    chat,
                    guard_action="rewrite",
                    guard_policy="pii",
                    guard_category="pii",
                    guard_rule="email",
                ),
                usage(
                    "g-redact2",
                    now - timedelta(minutes=1),
                    chat,
                    guard_action="rewrite",
                    guard_policy="pii",
                    guard_category="pii",
                    guard_rule="email",
                ),
            ]
        )
    found = ok(leader, "GET", "/api/v1/guard/events")
    since = datetime.fromisoformat(found["since"])
    assert timedelta(hours=23, minutes=59) < now - since < timedelta(hours=24, minutes=1)
    assert found["counts"] == [
        {"project": "acme/ml/chat", "action": "rewrite", "policy": "pii", "category": "pii", "count": 2},
        {"project": "acme/ml/chat", "action": "allow", "policy": "hook", "count": 1},
        {"project": "acme/ml/chat", "action": "block", "policy": "secrets", "category": "leaked_secret", "count": 1},
    ]
    assert [e["request_id"] for e in found["events"]] == ["req-g-redact2", "req-g-redact", "req-g-block"]
    assert found["events"][2] == {
        "at": found["events"][2]["at"],
        "request_id": "req-g-block",
        "project": "acme/ml/chat",
        "model": "sim-chat",
        "status": 400,
        "action": "block",
        "policy": "secrets",
        "category": "leaked_secret",
        "rule": "api-key",
        "guard_ms": 2,
    }
    week = ok(leader, "GET", "/api/v1/guard/events?since=7d")
    assert [e["request_id"] for e in week["events"]][-1] == "req-g-old"
    at = (now - timedelta(minutes=2, seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    recent = ok(leader, "GET", f"/api/v1/guard/events?since={at}")
    assert [e["request_id"] for e in recent["events"]] == ["req-g-redact2", "req-g-redact"]
    assert [(c["action"], c["count"]) for c in recent["counts"]] == [("rewrite", 2), ("allow", 1)]


@pytest.mark.parametrize("since", ["yesterday", "2026-03-04T05:06:07", "0s"])
def test_a_since_that_is_not_one_is_refused_naming_it(leader: Leader, since: str) -> None:
    error = refused(leader, "GET", f"/api/v1/guard/events?since={since}", None, 400)
    assert error.startswith(f"since: {since!r}"), error


def test_an_attachment_made_through_another_handle_on_the_store_is_followed(leader: Leader, database: str) -> None:
    detach_all(leader)
    chat = project_id(leader, "acme/ml/chat")
    with Store.open(database) as other:  # as another leader of the store attaches it
        other.add_guard_attachment("project", chat, "pii", by="elsewhere")
    wait_until(lambda: attachments(leader) != [], 3.0, "the other handle's attachment followed")
    assert attachments(leader) == [{"Scope": "project", "ScopeID": chat, "Policy": "pii", "name": "acme/ml/chat"}]
    assert leader.leader.guard_attachments.policies_for(project=chat) == ("pii",)


def test_a_policy_taken_out_of_the_settings_stays_attached_and_everything_survives_a_restart(leader: Leader) -> None:
    detach_all(leader)
    ok(leader, "POST", "/api/v1/guard/attachments", {"target": "org:acme", "policy": "secrets"})
    ok(leader, "POST", "/api/v1/guard/attachments", {"target": "team:acme/ml", "policy": "pii"})
    version = ok(leader, "GET", "/api/v1/settings")["version"]
    only_pii = "guard:\n  policies:\n    - name: pii\n      checks: [{pii: email}]\n"
    assert ok(leader, "PUT", "/api/v1/settings", {"base": version, "body": only_pii})["version"] == version + 1
    listed = ok(leader, "GET", "/api/v1/guard")
    assert listed["policies"] == ["pii"] and listed["default"] == []
    assert [(a["Scope"], a["Policy"]) for a in listed["attachments"]] == [("org", "secrets"), ("team", "pii")]
    assert "policy: 'secrets' is not a policy" in refused(
        leader, "POST", "/api/v1/guard/attachments", {"target": "team:acme/ml", "policy": "secrets"}, 400
    )

    again = leader.restart()  # raises if the leader did not stop cleanly
    try:
        assert [(a["Scope"], a["Policy"], a["name"]) for a in attachments(again)] == [
            ("org", "secrets", "acme"),
            ("team", "pii", "acme/ml"),
        ]
        removed = ok(again, "DELETE", "/api/v1/guard/attachments", {"target": "org:acme", "policy": "secrets"})
        assert removed["Policy"] == "secrets" and [a["Policy"] for a in attachments(again)] == ["pii"]
    finally:
        again.stop()
