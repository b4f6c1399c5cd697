"""People in memory: a disabled person's keys are refused at once, at start-up, and on every leader sharing the store."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.people import People
from opod.access.service import AccessService
from opod.http.errors import Unauthorized
from opod.security.nodetokens import NodeTokenMinter
from opod.store import Store

SECRET = secrets.token_bytes(32)


def open_leader(home: Path) -> tuple[AccessService, People]:
    """What a leader builds at start: the access service, then the people, from the same store."""
    store = Store.open(home=home)
    access = AccessService.load(store, NodeTokenMinter(SECRET))
    return access, People.load(store, access)


@pytest.fixture
def leaders(tmp_path: Path) -> Iterator[tuple[tuple[AccessService, People], tuple[AccessService, People]]]:
    """Two leaders on one store, as several leaders share PostgreSQL."""
    one, two = open_leader(tmp_path), open_leader(tmp_path)
    yield one, two
    one[0].store.close()
    two[0].store.close()


async def test_a_disabled_persons_keys_are_refused_at_once_and_back_when_reinstated(leaders) -> None:
    (access, people), _ = leaders
    ada = await people.create(email="ada@example.com", name="Ada")
    _, secret = await access.create("api", "ada's", user_id=ada.id)
    assert access.keys.check(f"Bearer {secret}").user_id == ada.id
    await people.update(ada.id, state="disabled")
    with pytest.raises(Unauthorized):
        access.keys.check(f"Bearer {secret}")
    assert people.user("ADA@example.com") is not None and not people.user_active(ada.id)
    await people.update(ada.id, state="active")
    assert access.keys.check(f"Bearer {secret}").user_id == ada.id


async def test_another_leader_follows_and_a_restart_remembers(leaders, tmp_path: Path) -> None:
    (access, people), (other_access, other_people) = leaders
    ada = await people.create(email="ada@example.com")
    await people.join(ada.id, "team_1", role="member", by="alice")
    _, secret = await access.create("api", "ada's", user_id=ada.id)
    other_access.keys.put(access.keys.check(f"Bearer {secret}"))  # the key as that leader loaded it
    await people.update(ada.id, state="disabled")
    assert other_access.keys.check(f"Bearer {secret}")  # not followed yet
    await other_people.follow()
    with pytest.raises(Unauthorized):
        other_access.keys.check(f"Bearer {secret}")
    assert [m.target for m in other_people.memberships(ada.id)] == ["team_1"]
    restarted_access, restarted = open_leader(tmp_path)
    try:
        with pytest.raises(Unauthorized):
            restarted_access.keys.check(f"Bearer {secret}")
        assert restarted.user(ada.id) is not None and restarted.targets(ada.id) == ["team_1"]
    finally:
        restarted_access.store.close()
    await people.update(ada.id, state="active")
    await other_people.follow()
    assert other_access.keys.check(f"Bearer {secret}").user_id == ada.id


async def test_matching_a_persons_memberships_changes_memory_with_the_store(leaders) -> None:
    (_, people), _ = leaders
    ada = await people.create(email="a@x")
    await people.join(ada.id, "prj_1", role="manager", by="alice")
    await people.join(ada.id, "prj_9", role="member", by="alice")  # not a place the groups decide
    change = await people.match_memberships(
        ada.id, {"prj_1": "member", "prj_2": "manager"}, targets={"prj_1", "prj_2"}, by="ldap"
    )
    assert change.added == [(ada.id, "prj_1"), (ada.id, "prj_2")] and change.removed == []
    assert {m.target: (m.role, m.by) for m in people.memberships(ada.id)} == {
        "prj_1": ("member", "ldap"),
        "prj_2": ("manager", "ldap"),
        "prj_9": ("member", "alice"),
    }
    again = await people.match_memberships(ada.id, {"prj_1": "member"}, targets={"prj_1", "prj_2"}, by="ldap")
    assert again.removed == [(ada.id, "prj_2")] and people.targets(ada.id) == ["prj_1", "prj_9"]
