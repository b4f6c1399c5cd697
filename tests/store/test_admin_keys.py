"""Admin keys of leaders sharing one store: each leader's start revokes only its own, never another's.

Two leaders are two ``Store`` objects (and two access services) over one database, each with its own home.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import update

from opod.access.service import AccessService
from opod.http.errors import Unauthorized
from opod.security.nodetokens import NodeTokenMinter
from opod.store import InvalidInput, Store, hash_secret
from opod.store.schema import keys
from tests.store.conftest import at

MINTER = NodeTokenMinter(secrets.token_bytes(32))
A, B = "host-a:/srv/a/.opod", "host-b:/srv/b/.opod"


def active_admins(store: Store) -> dict[str, str]:
    """Each active admin key's id and the leader it names."""
    return {k.id: k.leader_id for k in store.list_keys("admin") if k.revoked_at is None}


def test_a_leaders_new_admin_key_revokes_its_own_old_one_and_no_other_leaders(store: Store) -> None:
    first_a, none = store.replace_admin_key(A, hash=hash_secret("sk-admin-a1"), prefix="sk-admin-a", at=at(0))
    assert none == [] and first_a.leader_id == A and first_a.kind == "admin"
    first_b, none = store.replace_admin_key(B, hash=hash_secret("sk-admin-b1"), prefix="sk-admin-b", at=at(1))
    assert none == [], "B's first key revokes nothing of A's"
    assert active_admins(store) == {first_a.id: A, first_b.id: B}

    second_a, revoked = store.replace_admin_key(A, hash=hash_secret("sk-admin-a2"), prefix="sk-admin-a", at=at(2))
    assert [(k.id, k.revoked_at) for k in revoked] == [(first_a.id, at(2))]
    assert active_admins(store) == {first_b.id: B, second_a.id: A}
    assert store.get_key(first_a.id).revoked_at == at(2)


def test_an_admin_key_stored_before_keys_named_their_leader_is_claimed_or_revoked(store: Store) -> None:
    legacy = store.create_key(
        kind="admin", name="admin", hash=hash_secret("sk-admin-old"), prefix="sk-admin-o", created_at=at(0)
    )
    assert legacy.leader_id == ""
    claimed = store.claim_admin_key(legacy.id, A)
    assert claimed.leader_id == A and store.get_key(legacy.id).leader_id == A

    other = store.create_key(
        kind="admin", name="admin", hash=hash_secret("sk-admin-older"), prefix="sk-admin-o", created_at=at(1)
    )
    mine, revoked = store.replace_admin_key(B, hash=hash_secret("sk-admin-b"), prefix="sk-admin-b", at=at(2))
    assert [k.id for k in revoked] == [other.id], "a key naming no leader cannot be handed out by anyone: revoked"
    assert active_admins(store) == {legacy.id: A, mine.id: B}


def test_admin_key_writes_refuse_bad_input_and_change_nothing(store: Store) -> None:
    with pytest.raises(InvalidInput, match="leader id must not be empty"):
        store.replace_admin_key("", hash=hash_secret("sk-admin-x"), prefix="sk-admin-x")
    with pytest.raises(InvalidInput, match="only admin keys belong to a leader"):
        store.create_key(kind="api", name="bot", hash=hash_secret("sk-orc-x"), prefix="sk-orc-x", leader_id=A)
    assert store.list_keys() == []


def start(store: Store, home: Path, leader_id: str) -> tuple[AccessService, str | None]:
    """A leader's start as ``Leader.open`` does it: load the keys, then make sure of its admin key."""
    access = AccessService.load(store, MINTER)
    return access, access.ensure_admin_key(home / "admin.key", leader_id)


async def test_two_leaders_keep_their_admin_keys_across_starts_and_each_opens_both(
    open_store: Callable[[], Store], tmp_path: Path
) -> None:
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    home_a.mkdir(), home_b.mkdir()
    a, key_a = start(open_store(), home_a, A)
    b, key_b = start(open_store(), home_b, B)
    assert key_a and key_b and key_a != key_b
    await a.follow()
    for leader in (a, b):
        for key in (key_a, key_b):
            assert leader.keys.check(f"Bearer {key}", kinds=("admin",)).kind == "admin"

    again, shown = start(open_store(), home_a, A)  # A restarts, its admin.key as it was: nothing new
    assert shown is None and again.keys.check(f"Bearer {key_b}", kinds=("admin",)).kind == "admin"

    (home_a / "admin.key").unlink()  # A's key handed out no more: A's next start replaces it, B's stays
    fresh, key_a2 = start(open_store(), home_a, A)
    assert key_a2 and key_a2 != key_a
    assert await b.follow() >= 2
    for leader in (fresh, b):
        with pytest.raises(Unauthorized, match="revoked"):
            leader.keys.check(f"Bearer {key_a}", kinds=("admin",))
        assert leader.keys.check(f"Bearer {key_a2}", kinds=("admin",)).kind == "admin"
        assert leader.keys.check(f"Bearer {key_b}", kinds=("admin",)).kind == "admin"


def test_a_leader_claims_the_admin_key_its_file_holds_when_the_key_names_no_leader_or_another(
    store: Store, tmp_path: Path
) -> None:
    _, secret = start(store, tmp_path, A)
    assert secret is not None
    with store._write() as conn:  # as a store upgraded to 0014 holds it: no leader named
        conn.execute(update(keys).where(keys.c.kind == "admin").values(leader_id=""))
    access, shown = start(store, tmp_path, B)  # the same home under another name (its machine was renamed)
    assert shown is None, "the key in admin.key is kept, not replaced"
    assert list(active_admins(store).values()) == [B]
    assert access.keys.check(f"Bearer {secret}", kinds=("admin",)).kind == "admin"
