"""Taking someone out of a place refuses, from the next request on, their keys in the projects they no longer reach."""

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'opod.db'}") as opened:
        yield opened


async def test_leaving_and_groups_that_no_longer_give_a_place_refuse_the_keys_no_longer_reached_at_once(
    store: Store,
) -> None:
    access = AccessService.load(store, NodeTokenMinter(secrets.token_bytes(32)))
    people = People.load(store, access)
    acme = store.create_org("acme")
    ml = store.create_team(acme.id, "ml")
    chat, ops = store.create_project(ml.id, "chat"), store.create_project(ml.id, "ops")
    ada = await people.create(email="ada@example.com")
    await people.join(ada.id, ml.id, role="member", by="alice")
    await people.join(ada.id, ops.id, role="member", by="alice")
    chat_key, chat_secret = await access.create("api", "chat", project_id=chat.id, user_id=ada.id)
    _, ops_secret = await access.create("api", "ops", project_id=ops.id, user_id=ada.id)

    assert await people.leave(ada.id, ml.id) is True
    with pytest.raises(Unauthorized, match="revoked"):
        access.keys.check(f"Bearer {chat_secret}")
    assert access.keys.check(f"Bearer {ops_secret}")  # still a member of ops itself
    assert (await access.get_key(chat_key.id)).revoked_at is not None

    change = await people.match_memberships(ada.id, {}, targets=[ops.id], by="ldap")
    assert change.removed == [(ada.id, ops.id)] and len(change.revoked) == 1
    with pytest.raises(Unauthorized, match="revoked"):
        access.keys.check(f"Bearer {ops_secret}")
    assert people.targets(ada.id) == []
