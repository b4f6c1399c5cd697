"""The tenancy tree in the store: names unique among siblings, moves, deletes only when empty, audit rows with changes."""

from __future__ import annotations

import pytest

from opod.store import Conflict, InvalidInput, NotFound, Store, hash_secret
from opod.store.audit import AuditRow


def row(action: str, target: str) -> AuditRow:
    return AuditRow(actor="alice", source="api", action=action, target=target, detail="{}", status=200)


def test_a_tree_is_built_read_back_and_audited_with_each_change(store: Store) -> None:
    acme = store.create_org("acme", audit=row("POST /api/v1/orgs", "org:acme"))
    ml = store.create_team(acme.id, "ml", audit=row("POST /api/v1/teams", "team:acme/ml"))
    chat = store.create_project(ml.id, "chat")
    assert acme.id.startswith("org_") and ml.id.startswith("team_") and chat.id.startswith("prj_")
    tree = store.tenancy_tree()
    assert [o.name for o in tree.orgs] == ["acme"] and tree.teams == [ml] and tree.projects == [chat]
    assert not chat.had_key
    assert [a.target for a in store.list_audit()] == ["team:acme/ml", "org:acme"]


def test_names_are_unique_among_siblings_only(store: Store) -> None:
    acme, beta = store.create_org("acme"), store.create_org("beta")
    store.create_team(acme.id, "ml")
    store.create_team(beta.id, "ml")  # another parent: fine
    with pytest.raises(Conflict, match="a team named 'ml' already exists in acme"):
        store.create_team(acme.id, "ml")
    with pytest.raises(Conflict, match="organization named 'acme'"):
        store.create_org("acme")
    with pytest.raises(InvalidInput, match="name: 'a/b' is not a name"):
        store.create_org("a/b")
    with pytest.raises(NotFound, match="in: no organization with ID 'org_nope'"):
        store.create_team("org_nope", "ml")


def test_a_refused_change_writes_neither_the_change_nor_its_audit_row(store: Store) -> None:
    acme = store.create_org("acme")
    store.create_team(acme.id, "ml")
    with pytest.raises(Conflict):
        store.create_team(acme.id, "ml", audit=row("POST /api/v1/teams", "team:acme/ml"))
    assert store.list_audit() == [] and len(store.tenancy_tree().teams) == 1


def test_rename_and_move_keep_siblings_unique(store: Store) -> None:
    acme, beta = store.create_org("acme"), store.create_org("beta")
    ml, ops = store.create_team(acme.id, "ml"), store.create_team(beta.id, "ml")
    moved = store.change_tenancy("team", ops.id, name="ops", audit=row("PATCH /api/v1/teams/x", "team:beta/ops"))
    assert moved.name == "ops" and moved.org_id == beta.id
    moved = store.change_tenancy("team", ops.id, parent_id=acme.id)
    assert moved.org_id == acme.id and {t.org_id for t in store.tenancy_tree().teams} == {acme.id}
    with pytest.raises(Conflict, match="a team named 'ml' already exists in acme"):
        store.change_tenancy("team", ops.id, name="ml")
    with pytest.raises(NotFound, match="in: no team"):
        chat = store.create_project(ml.id, "chat")
        store.change_tenancy("project", chat.id, parent_id="team_0000000000000000")
    with pytest.raises(InvalidInput, match="cannot be moved"):
        store.change_tenancy("org", acme.id, parent_id=beta.id)


def test_delete_only_when_empty_and_a_project_that_had_a_key_only_renames(store: Store) -> None:
    acme = store.create_org("acme")
    ml = store.create_team(acme.id, "ml")
    chat, scratch = store.create_project(ml.id, "chat"), store.create_project(ml.id, "scratch")
    with pytest.raises(Conflict, match="still has 1 team"):
        store.delete_tenancy("org", acme.id)
    with pytest.raises(Conflict, match="still has 2 project"):
        store.delete_tenancy("team", ml.id)
    key = store.create_key(kind="api", name="bot", hash=hash_secret("sk-x"), prefix="sk-x", project_id=chat.id)
    assert key.project_id == chat.id and store.list_keys(project_id=chat.id) == [key]
    store.revoke_key(key.id)
    with pytest.raises(Conflict, match="can only be renamed"):
        store.delete_tenancy("project", chat.id)
    assert store.change_tenancy("project", chat.id, name="chat-old").name == "chat-old"
    store.delete_tenancy("project", scratch.id, audit=row("DELETE /api/v1/projects/x", "project:acme/ml/scratch"))
    assert [p.id for p in store.tenancy_tree().projects] == [chat.id]
    assert store.key_counts() == {chat.id: (1, 0)}
    with pytest.raises(NotFound):
        store.delete_tenancy("project", scratch.id)


def test_a_key_for_a_missing_project_is_refused_and_nothing_is_written(store: Store) -> None:
    with pytest.raises(NotFound, match="project: no project"):
        store.create_key(
            kind="api", name="bot", hash=hash_secret("sk-y"), prefix="sk-y", project_id="prj_0000000000000000"
        )
    assert store.list_keys() == []


def test_a_persons_keys_are_revoked_by_project(store: Store) -> None:
    acme = store.create_org("acme")
    ml = store.create_team(acme.id, "ml")
    a, b = store.create_project(ml.id, "a"), store.create_project(ml.id, "b")
    ka = store.create_key(
        kind="api", name="a", hash=hash_secret("sk-a"), prefix="sk-a", project_id=a.id, user_id="usr_1"
    )
    kb = store.create_key(
        kind="api", name="b", hash=hash_secret("sk-b"), prefix="sk-b", project_id=b.id, user_id="usr_1"
    )
    revoked = store.revoke_user_keys("usr_1", [a.id])
    assert [k.id for k in revoked] == [ka.id] and revoked[0].revoked_at is not None
    assert store.get_key(kb.id).revoked_at is None and store.get_key(ka.id).revoked_at is not None


def test_members_are_counted_and_a_project_with_members_is_not_removed(store: Store) -> None:
    acme = store.create_org("acme")
    ml = store.create_team(acme.id, "ml")
    chat = store.create_project(ml.id, "chat")
    ada = store.create_user(email="ada@example.com")
    store.set_membership(ada.id, chat.id, role="member", by="alice")
    store.set_membership(ada.id, acme.id, role="manager", by="alice")
    assert store.member_counts() == {chat.id: 1, acme.id: 1}
    with pytest.raises(Conflict, match="project 'chat' still has 1 member"):
        store.delete_tenancy("project", chat.id)
