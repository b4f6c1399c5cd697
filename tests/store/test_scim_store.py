"""What SCIM keeps beside the people: userNames and resources, the provider's groups, and what they grant."""

from __future__ import annotations

import pytest

from opod.access.group_rules import GroupRules, Place
from opod.store import Conflict, NotFound, Store, hash_secret
from opod.store.audit import AuditRow
from opod.store.scim import SCIM_BY


def _provision(store: Store, user_id: str, user_name: str, email: str, *, create: bool = True, state: str = "active"):
    return store.provision_user(
        user_id=user_id,
        user_name=user_name,
        email=email,
        name="",
        state=state,
        external_id="",
        document={"title": "Engineer"},
        create=create,
    )


def test_a_provisioned_person_keeps_any_user_name_and_their_resource(store: Store) -> None:
    person, kept = _provision(store, "usr_jdoe", "jdoe", "jdoe@example.com")
    assert (person.email, person.state, kept.user_name, kept.document, kept.version) == (
        "jdoe@example.com",
        "active",
        "jdoe",
        {"title": "Engineer"},
        1,
    )
    assert store.scim_user_by_name("JDOE") == store.scim_user("usr_jdoe") == kept
    with pytest.raises(Conflict, match="userName 'JDoe'"):
        _provision(store, "usr_other", "JDoe", "other@example.com")
    with pytest.raises(Conflict, match="provisioned person usr_jdoe"):
        _provision(store, "usr_other", "other", "JDOE@example.com")
    assert [u.user_id for u in store.scim_users()] == ["usr_jdoe"]
    _, again = _provision(store, "usr_jdoe", "jdoe", "jdoe@example.com", create=False, state="disabled")
    assert again.version == 2 and store.get_user("usr_jdoe").state == "disabled"


def test_a_person_scim_never_provisioned_is_taken_over_by_email(store: Store) -> None:
    local = store.create_user(email="ada@example.com", name="Ada")
    person, _ = _provision(store, "usr_new", "ada", "Ada@example.com")
    assert person.id == local.id and store.scim_user(local.id) is not None
    assert store.get_user(local.id).email == "Ada@example.com"


def test_groups_grant_memberships_and_take_back_only_those_they_made(store: Store) -> None:
    org = store.create_org("acme")
    team = store.create_team(org.id, "eng")
    project = store.create_project(team.id, "chat")
    for n in ("a", "b"):
        _provision(store, f"usr_{n}", n, f"{n}@example.com")
    store.set_membership("usr_b", team.id, role="member", by="alice")  # an operator's: never touched
    grants = GroupRules("auth.scim_groups", grants={"engineering": (Place(team.id, "acme/eng", "manager"),)})
    key = store.create_key(
        kind="api", name="a's", hash=hash_secret("sk-a"), prefix="sk-a", project_id=project.id, user_id="usr_a"
    )
    audit = AuditRow("scim", "api", "POST /scim/v2/Groups", "group:grp_1", "{}", 201)
    group, change = store.put_scim_group(
        "grp_1",
        display_name="Engineering",
        external_id="g-1",
        document={},
        members={"usr_a": "A", "usr_b": ""},
        create=True,
        grants=grants,
        audit=audit,
    )
    assert group.members == (("usr_a", "A"), ("usr_b", "")) and change.added == [("usr_a", team.id)]
    held = {(m.user_id, m.role, m.by) for m in store.list_memberships(target=team.id)}
    assert held == {("usr_a", "manager", SCIM_BY), ("usr_b", "member", "alice")}
    with pytest.raises(Conflict, match="displayName"):
        store.put_scim_group(
            "grp_2", display_name="ENGINEERING", external_id="", document={}, members={}, create=True, grants=grants
        )
    with pytest.raises(NotFound, match="usr_nobody"):
        store.put_scim_group(
            "grp_1",
            display_name="Engineering",
            external_id="",
            document={},
            members={"usr_nobody": ""},
            create=False,
            grants=grants,
        )
    # The mapping loses the group: what it made is taken back, with the key that reached nowhere else.
    change = store.sync_scim_grants(GroupRules("auth.scim_groups"))
    assert change.removed == [("usr_a", team.id)] and [k.id for k in change.revoked] == [key.id]
    assert {m.user_id for m in store.list_memberships(target=team.id)} == {"usr_b"}
    assert (
        store.delete_scim_group("grp_1", grants=GroupRules("auth.scim_groups")).removed == []
        and store.scim_group("grp_1") is None
    )
