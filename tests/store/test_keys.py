"""API keys, the admin key and node tokens, kept as SHA-256."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from opod.store import Conflict, InvalidInput, KeyRecord, NotFound, Store, hash_secret
from tests.store.conftest import T0, at


def make_key(store: Store, secret: str = "sk-orc-alpha", **fields: Any) -> KeyRecord:
    args: dict[str, Any] = {
        "kind": "api",
        "name": "ci bot",
        "hash": hash_secret(secret),
        "prefix": secret[:10],
        "created_at": T0,
    }
    args.update(fields)
    return store.create_key(**args)


def test_a_created_key_reads_back_by_id_and_by_hash(store: Store) -> None:
    key = make_key(store, team="research", admission_class="interactive", expires_at=at(3600))
    assert key.id.startswith("k_") and key.kind == "api" and key.prefix == "sk-orc-alp"
    assert key.hash == hash_secret("sk-orc-alpha") and len(key.hash) == 64
    assert store.get_key(key.id) == key
    assert store.key_by_hash(hash_secret("sk-orc-alpha")) == key
    assert store.key_by_hash(hash_secret("sk-orc-someone-else")) is None
    assert (key.team, key.admission_class, key.expires_at) == ("research", "interactive", at(3600))
    assert key.revoked_at is None and key.last_used_at is None and key.node_id is None


def test_times_come_back_timezone_aware_in_utc(store: Store) -> None:
    paris = timezone(timedelta(hours=1))
    key = make_key(store, created_at=datetime(2026, 3, 4, 6, 0, tzinfo=paris))
    read = store.get_key(key.id)
    assert read.created_at == datetime(2026, 3, 4, 5, 0, tzinfo=UTC)
    assert read.created_at.utcoffset() == timedelta(0) and read.created_at.tzinfo is not None
    fresh = make_key(store, secret="sk-orc-now", created_at=None)
    assert abs(store.get_key(fresh.id).created_at - datetime.now(UTC)) < timedelta(minutes=1)


def test_the_secret_itself_is_never_stored(store: Store) -> None:
    key = make_key(store, secret="sk-orc-topsecret-123456")
    assert "sk-orc-topsecret-123456" not in repr(store.list_keys())
    assert key.prefix == "sk-orc-top"


def test_list_keys_orders_by_creation_and_filters_by_kind(store: Store) -> None:
    api = make_key(store, "sk-a", created_at=at(2))
    admin = make_key(store, "sk-admin", kind="admin", name="admin", created_at=at(1))
    node = make_key(store, "nt-1", kind="node", name="gpu-box", created_at=at(3))
    assert [k.id for k in store.list_keys()] == [admin.id, api.id, node.id]
    assert store.list_keys(kind="node") == [node]
    assert store.list_keys(kind="admin") == [admin]
    with pytest.raises(InvalidInput, match="key kind 'root' is not one of admin, api, node"):
        store.list_keys(kind="root")  # type: ignore[arg-type]


def test_a_second_key_with_the_same_hash_is_a_conflict_and_writes_nothing(store: Store) -> None:
    first = make_key(store, "sk-same")
    with pytest.raises(Conflict, match=f"key '{first.id}' already has this hash.*generate a new key"):
        make_key(store, "sk-same", name="copy")
    make_key(store, "sk-other", id="k_fixed")
    with pytest.raises(Conflict, match="a key with id 'k_fixed' already exists; choose another id"):
        make_key(store, "sk-third", id="k_fixed")
    assert sorted(k.id for k in store.list_keys()) == sorted([first.id, "k_fixed"])
    assert store.key_by_hash(hash_secret("sk-third")) is None


def test_revoke_is_idempotent_and_keeps_the_first_time(store: Store) -> None:
    key = make_key(store)
    assert key.usable(at(1))
    revoked = store.revoke_key(key.id, at(10))
    assert revoked.revoked_at == at(10) and not revoked.usable(at(11))
    assert store.revoke_key(key.id, at(20)).revoked_at == at(10)
    assert store.get_key(key.id).revoked_at == at(10)
    with pytest.raises(NotFound, match="key 'k_nope' does not exist"):
        store.revoke_key("k_nope", at(1))


def test_an_expired_key_is_not_usable(store: Store) -> None:
    key = make_key(store, expires_at=at(60))
    assert key.usable(at(59)) and not key.usable(at(60))


def test_a_node_token_may_be_created_bound(store: Store) -> None:
    token = make_key(store, "nt-bound", kind="node", node_id="node-z")
    assert store.get_key(token.id).node_id == "node-z"
    with pytest.raises(InvalidInput, match="only node tokens are bound to a node"):
        make_key(store, "sk-x", node_id="node-z")


def test_keys_used_are_marked_in_one_batch_and_times_only_move_forward(store: Store) -> None:
    first, second = make_key(store, "sk-first"), make_key(store, "sk-second")
    untouched = make_key(store, "sk-third")
    assert store.mark_keys_used([first.id, second.id, "k_cp_from_the_auth_file"], at(10)) == 2
    assert store.get_key(first.id).last_used_at == at(10) and store.get_key(second.id).last_used_at == at(10)
    assert store.get_key(untouched.id).last_used_at is None
    assert store.mark_keys_used([first.id], at(5)) == 0  # a late batch does not move it back
    assert store.get_key(first.id).last_used_at == at(10)
    store.mark_keys_used([first.id], at(30))
    assert store.get_key(first.id).last_used_at == at(30)
    assert store.mark_keys_used([], at(40)) == 0


def test_get_key_names_the_missing_key(store: Store) -> None:
    with pytest.raises(NotFound, match="key 'k_123' does not exist; list the keys"):
        store.get_key("k_123")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "root"}, "key kind 'root' is not one of admin, api, node"),
        ({"hash": "not-a-hash"}, "a key hash is 64 hex digits"),
        ({"hash": "ab" * 31}, "a key hash is 64 hex digits"),
        ({"created_at": datetime(2026, 1, 1)}, "created_at 2026-01-01T00:00:00 has no timezone"),
        ({"expires_at": datetime(2026, 1, 1)}, "expires_at 2026-01-01T00:00:00 has no timezone"),
        ({"expires_at": T0}, "expires_at .* is not after created_at"),
        ({"prefix": "sk-orc-" + "x" * 40}, "keep at most 24, never the whole key"),
        ({"id": ""}, "key id must not be empty"),
        ({"name": 7}, "key name must be text, not int"),
    ],
)
def test_bad_key_input_is_refused_before_writing(store: Store, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        make_key(store, **fields)
    assert store.list_keys() == []


def test_an_uppercase_hash_is_the_same_hash(store: Store) -> None:
    key = make_key(store, "sk-case")
    assert store.key_by_hash(key.hash.upper()) == key
    with pytest.raises(InvalidInput):
        store.key_by_hash("zz")


def test_racing_writers_of_one_hash_get_one_key_and_conflicts(store: Store) -> None:
    def attempt(n: int) -> str:
        try:
            return make_key(store, "sk-raced", name=f"writer {n}").id
        except Conflict:
            return "conflict"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    assert outcomes.count("conflict") == 7
    assert [k.id for k in store.list_keys()] == [o for o in outcomes if o != "conflict"]
