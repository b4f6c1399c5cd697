"""Taking someone out of a place is one transaction: the membership, the keys in projects no longer reached, the audit row.

Several leaders share the store, so this also covers what another leader reads back: the keys
created or revoked since a moment (``keys_changed_since``), the query each leader follows keys with.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from opod.store import Store, hash_secret
from opod.store.audit import AuditRow
from opod.store.errors import InvalidInput
from tests.store.conftest import at


def row(action: str, status: int = 200) -> AuditRow:
    return AuditRow(actor="alice", source="api", action=action, target="user:ada", detail="{}", status=status)


@dataclass
class World:
    org: str
    ml: str
    ops: str
    chat: str
    eval: str
    batch: str
    ada: str
    bob: str


@pytest.fixture
def world(store: Store) -> World:
    """acme/ml/{chat,eval} and acme/ops/batch; Ada and Bob in team ml and in project batch, each with a key in each project."""
    acme = store.create_org("acme")
    ml, ops = store.create_team(acme.id, "ml"), store.create_team(acme.id, "ops")
    chat, ev, batch = (
        store.create_project(ml.id, "chat"),
        store.create_project(ml.id, "eval"),
        store.create_project(ops.id, "batch"),
    )
    ada, bob = store.create_user(email="ada@example.com"), store.create_user(email="bob@example.com")
    store.set_membership(ada.id, ml.id)
    store.set_membership(ada.id, batch.id)
    store.set_membership(bob.id, ml.id)
    store.set_membership(bob.id, batch.id)
    for project in (chat, ev, batch):
        for person in (ada, bob):
            store.create_key(
                kind="api",
                name=f"{person.email} {project.name}",
                hash=hash_secret(f"sk-{person.id}-{project.id}"),
                prefix="sk-x",
                project_id=project.id,
                user_id=person.id,
                created_at=at(1),
            )
    return World(acme.id, ml.id, ops.id, chat.id, ev.id, batch.id, ada.id, bob.id)


def active_projects(store: Store, user_id: str) -> set[str]:
    return {k.project_id for k in store.list_keys("api") if k.user_id == user_id and k.revoked_at is None}


def test_leaving_a_team_revokes_the_keys_in_its_projects_with_the_membership_and_the_audit_row(
    store: Store, world: World
) -> None:
    change = store.leave(world.ada, world.ml, at=at(10), audit=row("DELETE /api/v1/users/ada/memberships"))
    assert change.removed == [world.ada]
    assert sorted(k.project_id for k in change.revoked) == sorted([world.chat, world.eval])
    assert all(k.revoked_at == at(10) for k in change.revoked)
    assert active_projects(store, world.ada) == {world.batch}  # still a member of batch itself
    assert active_projects(store, world.bob) == {world.chat, world.eval, world.batch}  # nobody else's keys
    assert [m.target for m in store.list_memberships(world.ada)] == [world.batch]
    assert [r.action for r in store.list_audit()] == ["DELETE /api/v1/users/ada/memberships"]


def test_a_membership_still_held_above_keeps_the_keys(store: Store, world: World) -> None:
    store.set_membership(world.ada, world.org)
    change = store.leave(world.ada, world.ml, audit=row("DELETE m"))
    assert change.removed == [world.ada] and change.revoked == []
    assert active_projects(store, world.ada) == {world.chat, world.eval, world.batch}


def test_leaving_where_one_is_not_changes_nothing_and_audits_nothing(store: Store, world: World) -> None:
    change = store.leave(world.ada, world.ops, audit=row("DELETE m"))
    assert (change.removed, change.revoked) == ([], [])
    assert store.list_audit() == []


def test_a_failure_in_the_transaction_leaves_the_membership_and_the_keys_as_they_were(
    store: Store, world: World
) -> None:
    with pytest.raises(InvalidInput, match="audit status"):
        store.leave(world.ada, world.ml, audit=row("DELETE m", status=999))  # the audit row is the last write
    assert {m.target for m in store.list_memberships(world.ada)} == {world.ml, world.batch}
    assert active_projects(store, world.ada) == {world.chat, world.eval, world.batch}
    with pytest.raises(InvalidInput, match="audit status"):
        store.match_memberships({}, targets=[world.batch], audit=row("PUT /scim/v2/Groups", status=999))
    assert {m.user_id for m in store.list_memberships(target=world.batch)} == {world.ada, world.bob}
    assert active_projects(store, world.bob) == {world.chat, world.eval, world.batch}
    assert store.list_audit() == []


def test_matching_revokes_the_keys_of_those_who_leave_in_the_same_transaction(store: Store, world: World) -> None:
    role = {m.user_id: m.role for m in store.list_memberships(target=world.batch)}[world.ada]
    change = store.match_memberships(
        {(world.ada, world.batch): role}, targets=[world.batch], by="scim", at=at(20), audit=row("PUT /scim/v2/Groups")
    )
    assert (change.added, change.removed) == ([], [(world.bob, world.batch)])
    assert [(k.user_id, k.project_id) for k in change.revoked] == [(world.bob, world.batch)]
    assert active_projects(store, world.bob) == {world.chat, world.eval}  # still reached through team ml
    assert active_projects(store, world.ada) == {world.chat, world.eval, world.batch}
    assert len(store.list_audit()) == 1


def test_keys_changed_since_names_what_was_created_or_revoked_from_then_on(store: Store, world: World) -> None:
    assert len(store.keys_changed_since(None, ("api",))) == 6
    assert store.keys_changed_since(at(2), ("api",)) == []
    fresh = store.create_key(kind="api", name="new", hash=hash_secret("sk-new"), prefix="sk-n", created_at=at(5))
    store.create_key(kind="node", name="n", hash=hash_secret("nt-1"), prefix="nt", created_at=at(5))
    revoked = store.leave(world.bob, world.batch, at=at(6)).revoked
    changed = store.keys_changed_since(at(5), ("api",))
    assert {k.id for k in changed} == {fresh.id} | {k.id for k in revoked}
    assert {k.kind for k in store.keys_changed_since(at(5), ("api", "node"))} == {"api", "node"}
