"""The key table: local keys one by one, the auth file's keys swapped whole, tombstones for good."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from opod.access.keytable import KeyEntry, KeyTable, StaleSnapshot, snapshot_key_id
from opod.http.errors import Unauthorized
from opod.security.keys import hash_key


def local(secret: str, id_: str = "k_local", kind: str = "api") -> KeyEntry:
    return KeyEntry(id_, kind, "local", hash_key(secret))


def from_file(secret: str, file_id: str) -> KeyEntry:
    return KeyEntry(snapshot_key_id(file_id), "api", file_id, hash_key(secret), source="snapshot")


def bearer(secret: str) -> str:
    return f"Bearer {secret}"


def test_a_snapshot_replaces_the_files_keys_whole_and_leaves_local_keys_alone() -> None:
    keys = KeyTable()
    keys.put(local("sk-local"))
    keys.apply_snapshot("r1", True, None, [from_file("sk-a", "a"), from_file("sk-b", "b")])
    assert {e.id for e in keys.snapshot_keys()} == {"k_cp_a", "k_cp_b"}
    held = keys.auth
    keys.apply_snapshot("r2", True, None, [from_file("sk-b", "b")])
    assert held is not None and held.revision == "r1" and len(held.by_hash) == 2  # a reader's old view stays whole
    with pytest.raises(Unauthorized, match="not known"):
        keys.check(bearer("sk-a"))
    assert keys.check(bearer("sk-b")).id == "k_cp_b"
    assert keys.check(bearer("sk-local")).id == "k_local"
    assert len(keys) == 2


def test_a_local_key_wins_over_a_file_key_with_the_same_hash() -> None:
    keys = KeyTable()
    keys.put(local("sk-same"))
    keys.apply_snapshot("r1", True, None, [from_file("sk-same", "x")])
    assert keys.check(bearer("sk-same")).id == "k_local"


def test_tombstones_only_grow_and_name_file_keys_in_either_spelling() -> None:
    keys = KeyTable()
    assert keys.add_tombstones(["bob", "k_cp_carol", ""]) == {"k_cp_bob", "k_cp_carol"}
    assert keys.add_tombstones(["k_cp_bob"]) == frozenset()
    keys.apply_snapshot("r1", True, None, [from_file("sk-bob", "bob"), from_file("sk-dave", "dave")])
    with pytest.raises(Unauthorized, match="revoked by the manager"):
        keys.check(bearer("sk-bob"))
    assert [e.id for e in keys.snapshot_keys()] == ["k_cp_dave"]
    keys.put(local("sk-bob-local", id_="bob"))  # a local key called bob is not the file's bob
    assert keys.check(bearer("sk-bob-local")).id == "bob"


def test_require_keys_is_the_files_once_one_is_applied() -> None:
    keys = KeyTable()
    assert keys.require_keys(True) is True and keys.require_keys(False) is False
    assert keys.authenticate(None, default_require=False) is None
    with pytest.raises(Unauthorized, match="No API key"):
        keys.authenticate(None, default_require=True)
    keys.apply_snapshot("r1", False, None, [from_file("sk-a", "a")])
    assert keys.require_keys(True) is False
    assert keys.authenticate(None, default_require=True) is None
    assert keys.authenticate("Bearer nope", default_require=True) is None
    assert keys.authenticate(bearer("sk-a"), default_require=True).id == "k_cp_a"
    keys.apply_snapshot("r2", True, None, [])
    with pytest.raises(Unauthorized):
        keys.authenticate(None, default_require=False)


def test_staleness_refuses_file_keys_naming_both_numbers_and_the_remedy() -> None:
    keys = KeyTable()
    keys.put(local("sk-local"))
    issued = datetime.now(UTC) - timedelta(seconds=400)
    keys.apply_snapshot("r9", True, issued, [from_file("sk-a", "a")])
    assert keys.check(bearer("sk-a")).id == "k_cp_a"  # 0 = fail-static
    keys.max_snapshot_age_sec = 300
    with pytest.raises(StaleSnapshot) as caught:
        keys.check(bearer("sk-a"))
    message = caught.value.message
    assert caught.value.status == 503 and caught.value.code == "auth_snapshot_stale"
    assert "issued 400 s ago" in message and "auth.maxSnapshotAgeSec of 300 s" in message
    assert "must write a fresh auth file" in message
    assert keys.check(bearer("sk-local")).id == "k_local"
    assert 399 <= keys.snapshot_age_sec() <= 410
    keys.apply_snapshot("r10", True, None, [from_file("sk-a", "a")])  # no issuedAt: age unknown, no bound
    assert keys.snapshot_age_sec() is None and keys.check(bearer("sk-a")).id == "k_cp_a"
    future = datetime.now(UTC) + timedelta(seconds=60)  # a manager's clock ahead of ours
    keys.apply_snapshot("r11", True, future, [from_file("sk-a", "a")])
    assert keys.snapshot_age_sec() == 0.0 and keys.check(bearer("sk-a"))


def test_local_keys_keep_their_old_behaviour() -> None:
    keys = KeyTable()
    keys.put(local("sk-admin", id_="k_admin", kind="admin"))
    keys.put(KeyEntry("k_old", "api", "old", hash_key("sk-old"), expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert keys.check(bearer("sk-admin"), kinds=("admin",)).id == "k_admin"
    with pytest.raises(Unauthorized, match="expired"):
        keys.check(bearer("sk-old"))
    keys.revoke("k_admin")
    with pytest.raises(Unauthorized, match="was revoked"):
        keys.check(bearer("sk-admin"), kinds=("admin",))
    with pytest.raises(Unauthorized, match="Bearer <key>"):
        keys.check("Basic abc")


def _refusal(keys: KeyTable, authorization: str | None, kinds: tuple[str, ...]) -> str:
    with pytest.raises(Unauthorized) as caught:
        keys.check(authorization, kinds=kinds)
    return caught.value.message


def test_the_admin_apis_refusals_say_where_the_admin_key_is_not_how_to_make_a_client_key() -> None:
    keys = KeyTable()
    keys.put(local("sk-client", id_="k_client"))
    keys.put(local("sk-admin", id_="k_admin", kind="admin"))
    admin = ("admin",)
    for authorization in (None, "Bearer sk-unknown", bearer("sk-client"), "Basic abc"):
        message = _refusal(keys, authorization, admin)
        assert "create one with `opod token create`" not in message, message
        assert "API key" not in message, "the admin listeners rewrite 'API key'; an admin refusal never says it"
    assert "send `Authorization: Bearer <admin key>`" in _refusal(keys, None, admin)
    assert "admin.key in the leader's OPOD_HOME" in _refusal(keys, None, admin)
    assert "client key (k_client), not the admin key" in _refusal(keys, bearer("sk-client"), admin)
    assert "admin.key in the leader's OPOD_HOME" in _refusal(keys, "Bearer sk-unknown", admin)
    keys.revoke("k_admin")
    assert "Admin key k_admin was revoked; the admin key is in admin.key in the leader's OPOD_HOME" in _refusal(
        keys, bearer("sk-admin"), admin
    )


def test_the_admin_refusal_names_the_home_and_clients_still_hear_token_create() -> None:
    keys = KeyTable()
    assert "admin.key in the leader's OPOD_HOME (~/.opod/admin.key by default)" in _refusal(keys, None, ("admin",))
    client = _refusal(keys, None, ("api", "admin"))
    assert client.startswith("No API key") and "`opod token create`" in client
    assert "`opod token create`" in _refusal(keys, "Bearer sk-unknown", ("api", "admin"))


def test_a_key_is_kept_as_its_sha256_and_its_expiry_holds_through_a_revocation() -> None:
    # The digest stored keys and auth files were made with: the standard SHA-256, whichever implementation makes it.
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    keys = KeyTable()
    later = datetime.now(UTC) + timedelta(hours=1)
    keys.put(KeyEntry("k_soon", "api", "soon", hash_key("sk-soon"), expires_at=later))
    assert keys.check(bearer("sk-soon")).id == "k_soon", "a key whose expiry is ahead serves"
    keys.revoke("k_soon")
    with pytest.raises(Unauthorized, match="was revoked"):
        keys.check(bearer("sk-soon"))
    (revoked,) = [e for e in keys.local_entries() if e.id == "k_soon"]
    assert revoked.expires_at == later and revoked.expires_s == later.timestamp()
