"""A model's owner through ``/api/v1/models``: kept and answered as ``kind:ID``, an owner that names nothing refused,
and an owner stored by name before found by ID when the leader starts. A leader built in the test's process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.store import Store
from tests.support.inprocess import InProcessLeader as Leader


def sim(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "profiles": [{"engine": "sim"}], "scaling": {"min": 0}, **fields}


SCOPES: dict[str, str] = {}
"""``team:acme/ml`` → ``team:ID``, for the tree the module's leader has."""


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("owner") / "home")
    for kind, name, parent, path in [
        ("org", "acme", None, "acme"),
        ("team", "ml", "acme", "acme/ml"),
        ("project", "chat", "acme/ml", "acme/ml/chat"),
    ]:
        status, item = up.admin("POST", f"/api/v1/{kind}s", {"name": name, **({"in": parent} if parent else {})})
        assert status == 201, item
        SCOPES[f"{kind}:{path}"] = f"{kind}:{item['id']}"
    yield up
    up.stop()


def scope_id(leader: Leader, kind: str, path: str) -> str:
    return SCOPES[f"{kind}:{path}"]


def audit_rows(leader: Leader, action: str) -> list[dict[str, Any]]:
    status, rows = leader.admin("GET", "/api/v1/audit?contains=" + action.split(" ", 1)[1])
    assert status == 200, rows
    return [r for r in rows if r["action"] == action]


def test_an_owner_given_by_path_is_kept_and_answered_by_id(leader: Leader) -> None:
    team = scope_id(leader, "team", "acme/ml")
    assert leader.admin("POST", "/api/v1/models", sim("owned", owner="team:acme/ml")) == (200, {"added": "owned"})
    assert leader.admin("GET", "/api/v1/models/owned")[1]["owner"] == team
    listed = {m["name"]: m for m in leader.admin("GET", "/api/v1/models")[1]}
    assert listed["owned"]["owner"] == team

    project = scope_id(leader, "project", "acme/ml/chat")
    assert leader.admin("POST", "/api/v1/models/owned/owner", {"owner": "project:acme/ml/chat"}) == (
        200,
        {"model": "owned", "owner": project},
    )
    assert leader.admin("POST", "/api/v1/models/owned/owner", {"owner": team}) == (
        200,
        {"model": "owned", "owner": team},
    )


def test_an_owner_that_names_nothing_is_refused_and_nothing_is_kept(leader: Leader) -> None:
    status, error = leader.admin("POST", "/api/v1/models", sim("stray", owner="team:nope/nope"))
    assert status == 404 and error["error"].startswith("owner: no team 'team:nope/nope'"), error
    assert leader.admin("GET", "/api/v1/models/stray")[0] == 404
    assert [r["status"] for r in audit_rows(leader, "POST /api/v1/models")][:1] == [404], "the refusal is audited"

    adapters = [{"name": "legal", "source": "acme/legal-lora", "owner": "project:acme/ml/none"}]
    status, error = leader.admin("POST", "/api/v1/models", sim("stray", adapters=adapters))
    assert status == 404 and "adapters[0].owner: no project" in error["error"], error

    assert leader.admin("POST", "/api/v1/models", sim("kept", owner="team:acme/ml"))[0] == 200
    team = scope_id(leader, "team", "acme/ml")
    for owner, code, words in [
        ("team:acme/nope", 404, "owner: no team 'team:acme/nope': organization 'acme' has no team 'nope'"),
        ("team:ghost", 400, "owner: 'team:ghost' is not a team path"),
        ("team:a/b/c", 400, "owner: 'team:a/b/c' is not a scope"),
    ]:
        status, error = leader.admin("POST", "/api/v1/models/kept/owner", {"owner": owner})
        assert status == code and words in error["error"], (owner, error)
    assert leader.admin("GET", "/api/v1/models/kept")[1]["owner"] == team, "a refused owner changes nothing"


def test_an_owner_stored_by_name_is_found_by_id_when_the_leader_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Store.open(None, home=home) as store:
        org = store.create_org("acme")
        team = store.create_team(org.id, "ml")
        for name, owner in [("old", "team:acme/ml"), ("orphan", "team:gone/ml")]:
            definition = CatalogModel(name=name, profiles=[CatalogProfile(engine="sim")], owner=owner)
            store.add_model(
                name, source_json="{}", definition_json=definition.model_dump_json(exclude_none=True, by_alias=True)
            )
    leader = Leader(home)
    try:
        assert leader.admin("GET", "/api/v1/models/old")[1]["owner"] == f"team:{team.id}"
        assert leader.admin("GET", "/api/v1/models/orphan")[1]["owner"] == "team:gone/ml", "kept where nothing matches"
        assert leader.admin("POST", "/api/v1/models/orphan/scale", {"min": 0})[0] == 200, "and it can still change"
    finally:
        leader.stop()
