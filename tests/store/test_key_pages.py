"""A key listing a page at a time: keyset paging on ids, a count, and a search by the start of a key's words."""

from __future__ import annotations

from alembic import command
from sqlalchemy import insert, text

from opod.store import KeyRecord, Store, hash_secret
from opod.store.keys import KeyFilter, search_terms
from opod.store.migrate import alembic_config
from opod.store.schema import key_terms, keys
from tests.store.conftest import T0, at


def make(store: Store, n: int, name: str) -> KeyRecord:
    return store.create_key(
        kind="api",
        id=f"k_{n:016x}",
        name=name,
        hash=hash_secret(f"sk-orc-{n}"),
        prefix=f"sk-orc-{n:04d}",
        created_at=at(n),
    )


def ids(store: Store, search: str = "", state: str = "", after: str = "", limit: int = 50) -> list[str]:
    found = store.page_keys(KeyFilter(kind="api", search=search, state=state), after=after, limit=limit)
    return [k.id for k in found.keys]


def test_search_matches_the_start_of_the_id_prefix_name_or_a_word_of_it_in_any_case(store: Store) -> None:
    make(store, 1, "Billing Robot")
    make(store, 2, "billing-cron")
    make(store, 3, "ci bot")
    make(store, 0x2A, "robotics lab")
    assert ids(store, "billing") == ["k_0000000000000001", "k_0000000000000002"]
    assert ids(store, "ROB") == ["k_0000000000000001", "k_000000000000002a"]
    assert ids(store, "billing r") == ["k_0000000000000001"]
    assert ids(store, "k_000000000000002") == ["k_000000000000002a"]
    assert ids(store, "sk-orc-0003") == ["k_0000000000000003"]
    assert ids(store, "bot") == ["k_0000000000000003"], "a word's middle is no match: 'Robot' does not start with it"
    assert ids(store, "  ci  ") == ["k_0000000000000003"]
    assert ids(store, "nothing") == []
    assert store.count_keys(KeyFilter(kind="api", search="billing")) == 2


def test_search_pages_with_the_state_and_counts_the_same_keys(store: Store) -> None:
    for n in range(1, 8):
        make(store, n, f"svc-{n} worker")
    store.revoke_key("k_0000000000000003", at=at(100))
    store.revoke_key("k_0000000000000005", at=at(100))
    first = store.page_keys(KeyFilter(kind="api", search="svc"), limit=3)
    assert [k.name for k in first.keys] == ["svc-1 worker", "svc-2 worker", "svc-3 worker"] and first.later
    rest = ids(store, "svc", after=first.keys[-1].id, limit=10)
    assert rest == [f"k_{n:016x}" for n in range(4, 8)]
    assert ids(store, "worker", state="revoked") == ["k_0000000000000003", "k_0000000000000005"]
    assert store.count_keys(KeyFilter(kind="api", search="worker", state="active")) == 5
    assert store.count_keys(KeyFilter(kind="api", search="svc-1")) == 1


def test_admin_keys_are_found_by_their_own_search(store: Store) -> None:
    store.replace_admin_key("leader-a", hash=hash_secret("sk-admin-x"), prefix="sk-adm-x", at=T0)
    found = store.page_keys(KeyFilter(kind="admin", search="SK-ADM"))
    assert [k.prefix for k in found.keys] == ["sk-adm-x"]
    assert ids(store, "sk-adm") == [], "an admin key is not an api key"


def test_keys_stored_before_the_search_are_found_after_the_migration(store: Store) -> None:
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(connection=conn), "0021")
        conn.execute(
            insert(keys),
            [
                {
                    "id": f"k_{n:016x}",
                    "kind": "api",
                    "name": f"Old Key {n}",
                    "hash": f"{n:064x}",
                    "prefix": f"sk-old-{n}",
                    "team": "",
                    "admission_class": "",
                    "created_at": T0,
                }
                for n in range(1, 4)
            ],
        )
        command.upgrade(alembic_config(connection=conn), "head")
        assert conn.execute(text("SELECT count(DISTINCT key_id) FROM key_terms")).scalar() == 3
    assert ids(store, "old key 2") == ["k_0000000000000002"]
    assert ids(store, "key") == [f"k_{n:016x}" for n in range(1, 4)]


def test_a_search_that_starts_most_keys_words_pages_and_counts_the_same(store: Store) -> None:
    rows = [
        {
            "id": f"k_{n:016x}",
            "kind": "api",
            "name": f"svc-{n}" if n % 3 else f"batch-{n}",
            "hash": f"{n:064x}",
            "prefix": f"sk-orc-{n}",
            "team": "",
            "admission_class": "",
            "created_at": T0,
            "revoked_at": T0 if n % 10 == 0 else None,
        }
        for n in range(1, 1201)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(keys), rows)
        terms = [{"term": t, "key_id": r["id"]} for r in rows for t in search_terms(r["id"], r["name"], r["prefix"])]
        conn.execute(insert(key_terms), terms)
    assert ids(store, "s", limit=3) == ["k_0000000000000001", "k_0000000000000002", "k_0000000000000003"]
    svc = [r["id"] for r in rows if str(r["name"]).startswith("svc-")]
    assert ids(store, "svc", limit=500) == svc[:500]
    assert ids(store, "svc", after=svc[499], limit=500) == svc[500:]
    before = store.page_keys(KeyFilter(kind="api", search="svc"), before=svc[3], limit=2)
    assert [k.id for k in before.keys] == svc[1:3] and before.earlier
    assert store.count_keys(KeyFilter(kind="api", search="s")) == 1200
    assert store.count_keys(KeyFilter(kind="api", search="s"), at_most=100) == 101, "a count stops past its cap"
    assert store.count_keys(KeyFilter(kind="api", search="s", state="revoked")) == 120
    assert store.count_keys(KeyFilter(kind="api", search="batch")) == 400
    assert ids(store, "svc-12") == [f"k_{n:016x}" for n in (121, 122, 124, 125, 127, 128)], "12 is a batch"
