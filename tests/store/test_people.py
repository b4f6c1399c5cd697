"""People, memberships and secrets in the store, each change with its audit row in the same transaction."""

from __future__ import annotations

import pytest

from opod.store import Conflict, InvalidInput, NotFound, Store
from opod.store.audit import AuditRow
from tests.store.conftest import T0, at


def row(action: str, target: str = "") -> AuditRow:
    return AuditRow(actor="scim", source="api", action=action, target=target, detail="{}", status=200, at=T0)


def test_a_person_reads_back_by_id_and_by_email_in_any_case(store: Store) -> None:
    person = store.create_user(email="Ada@Example.com", name="Ada", external_id="ext-1", created_at=T0)
    assert person.id.startswith("usr_") and person.state == "active" and person.role == ""
    assert store.get_user(person.id) == person
    assert store.user_by_email("ada@EXAMPLE.com") == person
    assert store.user_by_email("bob@example.com") is None
    assert [u.id for u in store.list_users()] == [person.id]


def test_an_email_is_one_person_whatever_its_case(store: Store) -> None:
    first = store.create_user(email="ada@example.com")
    with pytest.raises(Conflict, match="already belongs to person"):
        store.create_user(email="ADA@example.com")
    other = store.create_user(email="bob@example.com")
    with pytest.raises(Conflict):
        store.update_user(other.id, email="Ada@Example.com")
    assert store.update_user(first.id, email="ADA@example.com").email == "ADA@example.com"


def test_state_and_role_are_checked_and_listed_by_state(store: Store) -> None:
    with pytest.raises(InvalidInput, match="pending, active, disabled"):
        store.create_user(email="a@x", state="gone")
    with pytest.raises(InvalidInput, match="viewer"):
        store.create_user(email="a@x", role="root")
    ada = store.create_user(email="a@x", created_at=at(1))
    bob = store.create_user(email="b@x", created_at=at(2), role="operator")
    store.update_user(ada.id, state="disabled")
    assert [u.id for u in store.list_users("disabled")] == [ada.id]
    assert [u.id for u in store.list_users("active")] == [bob.id]
    with pytest.raises(NotFound):
        store.update_user("usr_nobody", name="x")


def test_a_change_and_its_audit_row_commit_together(store: Store) -> None:
    store.create_user(email="a@x", audit=row("POST /scim/v2/Users"))
    with pytest.raises(Conflict):
        store.create_user(email="A@x", audit=row("POST /scim/v2/Users", "refused"))
    assert [r.target for r in store.list_audit()] == [""]


def test_memberships_change_role_in_place_and_leave(store: Store) -> None:
    ada = store.create_user(email="a@x")
    store.set_membership(ada.id, "team_1", role="member", by="alice", at=at(1))
    store.set_membership(ada.id, "team_1", role="manager", by="bob", at=at(2), audit=row("POST m"))
    (one,) = store.list_memberships(ada.id)
    assert (one.target, one.role, one.by, one.at) == ("team_1", "manager", "bob", at(2))
    with pytest.raises(InvalidInput, match="member, manager"):
        store.set_membership(ada.id, "team_1", role="owner")
    with pytest.raises(NotFound):
        store.set_membership("usr_nobody", "team_1")
    assert store.remove_membership(ada.id, "team_1", audit=row("DELETE m")) is True
    assert store.remove_membership(ada.id, "team_1", audit=row("DELETE again")) is False
    assert store.list_memberships(ada.id) == []
    assert [r.action for r in store.list_audit()] == ["DELETE m", "POST m"]


def test_matching_makes_changes_and_takes_out_memberships_within_the_slice_alone(store: Store) -> None:
    ada, bob, cyd = (store.create_user(email=f"{n}@x") for n in "abc")
    store.set_membership(ada.id, "prj_1", role="manager", by="alice")
    store.set_membership(cyd.id, "prj_2", role="member", by="alice")  # outside the slice: never touched
    change = store.match_memberships(
        {(ada.id, "prj_1"): "member", (bob.id, "prj_1"): "member"}, targets=["prj_1"], by="ldap", audit=row("sync")
    )
    assert (change.added, change.removed) == (sorted([(ada.id, "prj_1"), (bob.id, "prj_1")]), [])
    held = {(m.user_id, m.role, m.by) for m in store.list_memberships(target="prj_1")}
    assert held == {(ada.id, "member", "ldap"), (bob.id, "member", "ldap")}
    assert store.match_memberships({(bob.id, "prj_1"): "member"}, targets=["prj_1"], audit=row("again")).removed == [
        (ada.id, "prj_1")
    ]
    unchanged = store.match_memberships({(bob.id, "prj_1"): "member"}, targets=["prj_1"], audit=row("nothing"))
    assert not unchanged.changed
    assert [r.action for r in store.list_audit()] == ["again", "sync"]  # a match that changed nothing wrote no row
    with pytest.raises(InvalidInput, match="member, manager"):
        store.match_memberships({(bob.id, "prj_1"): "owner"}, targets=["prj_1"])
    assert [m.target for m in store.list_memberships(cyd.id)] == ["prj_2"]


def test_matching_for_an_owner_leaves_what_others_made(store: Store) -> None:
    ada, bob = (store.create_user(email=f"{n}@x") for n in "ab")
    store.set_membership(ada.id, "prj_1", role="member", by="alice")
    change = store.match_memberships({(ada.id, "prj_1"): "manager"}, targets=["prj_1"], owner="scim", by="scim")
    assert not change.changed and store.list_memberships(ada.id)[0].role == "member"  # alice's, so left as it is
    store.match_memberships({(bob.id, "prj_1"): "manager"}, targets=["prj_1"], owner="scim", by="scim")
    change = store.match_memberships({}, targets=["prj_1"], owner="scim", by="scim")
    assert change.removed == [(bob.id, "prj_1")] and [m.user_id for m in store.list_memberships(target="prj_1")] == [
        ada.id
    ]


def test_secrets_are_kept_by_name_and_their_records_never_hold_the_value(store: Store) -> None:
    assert store.get_secret("auth/scim-token") is None and store.secret_info("auth/scim-token") is None
    first = store.put_secret("auth/scim-token", "tok-one-8f3a", by="alice", at=at(1), audit=row("PUT s"))
    store.put_secret("auth/scim-token", "tok-two-91bc", by="bob", at=at(2))
    assert store.get_secret("auth/scim-token") == "tok-two-91bc"
    info = store.secret_info("auth/scim-token")
    assert info is not None and (info.updated_by, info.updated_at) == ("bob", at(2))
    assert "tok-" not in repr(first) + repr(info)
    with pytest.raises(InvalidInput):
        store.put_secret("auth/scim-token", "")
