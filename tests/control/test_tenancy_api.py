"""Organizations, teams and projects through the management API, on one real leader.

What an operator sees building a tree, renaming and moving in it, and being refused: a move
that would make a cycle, a delete of something not empty, a name taken among siblings. Every
change and every refusal is in the audit log.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.inprocess import InProcessLeader as Leader


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    leader = Leader(tmp_path_factory.mktemp("tenancy") / "leader")
    yield leader
    leader.stop()


def ok(leader: Leader, method: str, path: str, body: object | None = None, status: int = 200) -> dict:
    got, answer = leader.admin(method, path, body)
    assert got == status, (method, path, got, answer)
    assert isinstance(answer, dict)
    return answer


def refused(leader: Leader, method: str, path: str, body: object | None, status: int) -> str:
    got, answer = leader.admin(method, path, body)
    assert got == status, (method, path, got, answer)
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    return answer["error"]


def orgs(leader: Leader) -> dict[str, dict]:
    status, body = leader.admin("GET", "/api/v1/orgs")
    assert status == 200 and isinstance(body, list), body
    return {o["name"]: o for o in body}


def audit(leader: Leader, contains: str) -> list[dict]:
    status, body = leader.admin("GET", f"/api/v1/audit?contains={contains}")
    assert status == 200 and isinstance(body, list), body
    return body


def test_a_tree_is_built_by_name_and_path_and_listed_whole(leader: Leader) -> None:
    acme = ok(leader, "POST", "/api/v1/orgs", {"name": "acme"}, 201)
    assert acme["id"].startswith("org_") and acme["name"] == "acme" and "in" not in acme
    ml = ok(leader, "POST", "/api/v1/teams", {"name": "ml", "in": "acme"}, 201)
    assert ml["id"].startswith("team_") and ml["in"] == acme["id"]
    chat = ok(leader, "POST", "/api/v1/projects", {"name": "chat", "in": "acme/ml"}, 201)
    search = ok(leader, "POST", "/api/v1/projects", {"name": "search", "in": ml["id"]}, 201)
    assert chat["id"].startswith("prj_") and chat["in"] == search["in"] == ml["id"]

    tree = orgs(leader)["acme"]
    assert tree["id"] == acme["id"] and tree["members"] == 0
    [team] = tree["teams"]
    assert (team["id"], team["name"], team["org"], team["members"]) == (ml["id"], "ml", acme["id"], 0)
    assert [p["path"] for p in team["projects"]] == ["acme/ml/chat", "acme/ml/search"]
    assert team["projects"][0] == {
        "id": chat["id"],
        "name": "chat",
        "team": ml["id"],
        "path": "acme/ml/chat",
        "users": 0,
        "keys": 0,
        "active_keys": 0,
    }
    assert [a["status"] for a in audit(leader, "org:acme")][-1:] == [201]
    assert {a["action"] for a in audit(leader, "project:acme/ml")} == {"POST /api/v1/projects"}


def test_names_are_unique_among_siblings_and_bad_input_names_the_field(leader: Leader) -> None:
    ok(leader, "POST", "/api/v1/orgs", {"name": "uniq"}, 201)
    ok(leader, "POST", "/api/v1/teams", {"name": "ml", "in": "uniq"}, 201)
    assert "a team named 'ml' already exists in uniq" in refused(
        leader, "POST", "/api/v1/teams", {"name": "ml", "in": "uniq"}, 409
    )
    assert "name:" in refused(leader, "POST", "/api/v1/orgs", {"name": "has/slash"}, 400)
    assert "name:" in refused(leader, "POST", "/api/v1/orgs", {}, 400)
    assert "in:" in refused(leader, "POST", "/api/v1/teams", {"name": "x"}, 400)
    message = refused(leader, "POST", "/api/v1/projects", {"name": "x", "in": "uniq/nope"}, 404)
    assert "in:" in message and "no team 'nope'" in message
    assert "in:" in refused(leader, "POST", "/api/v1/orgs", {"name": "child", "in": "uniq"}, 400)
    assert "colour" in refused(leader, "POST", "/api/v1/orgs", {"name": "x", "colour": "red"}, 400)
    # Each refusal is audited with its status, since nothing was committed with a change.
    statuses = {a["status"] for a in audit(leader, "/api/v1/teams")}
    assert {201, 409, 400} <= statuses


def test_rename_and_move_and_a_cycle_is_refused(leader: Leader) -> None:
    ok(leader, "POST", "/api/v1/orgs", {"name": "north"}, 201)
    south = ok(leader, "POST", "/api/v1/orgs", {"name": "south"}, 201)
    team = ok(leader, "POST", "/api/v1/teams", {"name": "data", "in": "north"}, 201)
    project = ok(leader, "POST", "/api/v1/projects", {"name": "etl", "in": "north/data"}, 201)

    renamed = ok(leader, "PATCH", "/api/v1/orgs/north", {"name": "nord"})
    assert renamed["name"] == "nord" and "nord" in orgs(leader) and "north" not in orgs(leader)
    moved = ok(leader, "PATCH", f"/api/v1/teams/{team['id']}", {"in": "south"})
    assert moved["in"] == south["id"]
    assert [p["path"] for t in orgs(leader)["south"]["teams"] for p in t["projects"]] == ["south/data/etl"]
    ok(leader, "PATCH", f"/api/v1/projects/{project['id']}", {"name": "etl2"})

    cycle = refused(leader, "PATCH", f"/api/v1/teams/{team['id']}", {"in": "south/data"}, 400)
    assert "in:" in cycle and "into itself" in cycle and "cycle" in cycle
    into_project = refused(leader, "PATCH", f"/api/v1/projects/{project['id']}", {"in": "south/data/etl2"}, 400)
    assert "cycle" in into_project
    assert "cannot be moved" in refused(leader, "PATCH", "/api/v1/orgs/nord", {"in": "south"}, 400)
    assert "in:" in refused(leader, "PATCH", f"/api/v1/teams/{team['id']}", {"in": "nowhere"}, 404)
    assert "name or in" in refused(leader, "PATCH", f"/api/v1/teams/{team['id']}", {}, 400)
    assert "no team" in refused(leader, "PATCH", "/api/v1/teams/team_0000000000000000", {"name": "x"}, 404)
    # The refused moves changed nothing.
    assert [t["name"] for t in orgs(leader)["south"]["teams"]] == ["data"]
    assert any(a["status"] == 200 and a["target"] == f"team:{team['id']}" for a in audit(leader, team["id"]))


def test_delete_only_when_empty(leader: Leader) -> None:
    org = ok(leader, "POST", "/api/v1/orgs", {"name": "gone"}, 201)
    team = ok(leader, "POST", "/api/v1/teams", {"name": "t", "in": "gone"}, 201)
    project = ok(leader, "POST", "/api/v1/projects", {"name": "p", "in": "gone/t"}, 201)
    assert "still has 1 team" in refused(leader, "DELETE", "/api/v1/orgs/gone", None, 409)
    assert "still has 1 project" in refused(leader, "DELETE", f"/api/v1/teams/{team['id']}", None, 409)
    assert ok(leader, "DELETE", f"/api/v1/projects/{project['id']}") == {"id": project["id"], "deleted": True}
    ok(leader, "DELETE", f"/api/v1/teams/{team['id']}")
    ok(leader, "DELETE", f"/api/v1/orgs/{org['id']}")
    assert "gone" not in orgs(leader)
    assert "no organization" in refused(leader, "DELETE", "/api/v1/orgs/gone", None, 404)
    rows = audit(leader, project["id"])
    assert [(r["action"], r["status"]) for r in rows] == [("DELETE /api/v1/projects/{id}", 200)]
    assert rows[0]["detail"] == '{"path":"gone/t/p"}'
