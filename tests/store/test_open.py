"""Opening the store: which database, what an unreachable one says, restarts, concurrent openers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import text

from opod.store import ANY_NODE, Store, StoreError, hash_secret
from opod.store.migrate import head
from tests.store.conftest import at


def test_the_default_store_is_sqlite_in_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPOD_DATABASE_URL", raising=False)
    with Store.open(home=tmp_path / "home") as store:
        assert store.url == f"sqlite:///{tmp_path / 'home' / 'opod.db'}"
    assert (tmp_path / "home" / "opod.db").is_file()
    monkeypatch.setenv("OPOD_HOME", str(tmp_path / "from-env"))
    with Store.open() as store:
        store.set_meta("where", "env home")
    assert (tmp_path / "from-env" / "opod.db").is_file()


def test_opod_database_url_is_used_unless_the_caller_names_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPOD_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    with Store.open(home=tmp_path / "home") as store:
        assert store.url.endswith("env.db")
    with Store.open(f"sqlite:///{tmp_path / 'given.db'}") as store:
        assert store.url.endswith("given.db")
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["env.db", "given.db"]
    assert not (tmp_path / "home" / "opod.db").exists()


def test_an_unreachable_postgresql_names_the_url_without_its_password() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        Store.open("postgresql+psycopg://opod:hunter2@127.0.0.1:1/opod")
    message = str(caught.value)
    assert message.startswith("cannot open the store at postgresql+psycopg://opod:***@127.0.0.1:1/opod: ")
    assert "refused" in message.lower()
    assert "hunter2" not in message and "hunter2" not in repr(caught.value.__cause__)
    assert time.monotonic() - started < 10


def test_a_plain_postgresql_url_uses_psycopg() -> None:
    with pytest.raises(StoreError, match=r"postgresql\+psycopg://u:\*\*\*@127.0.0.1:1/x"):
        Store.open("postgresql://u:pw@127.0.0.1:1/x")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:pw@db/opod", r"mysql://u:\*\*\*@db/opod: the store runs on SQLite .* or PostgreSQL .*, not mysql"),
        ("postgresql+asyncpg://u:pw@db/opod", r"\*\*\*@db/opod: opod talks to PostgreSQL through psycopg 3"),
        ("sqlite://", "an in-memory SQLite store does not persist"),
        ("sqlite:///:memory:", "an in-memory SQLite store does not persist"),
        ("sqlite:////no/such/dir/opod.db", "the directory /no/such/dir does not exist"),
        ("not a url :pw@", "is not a database URL; use sqlite:///PATH or postgresql"),
    ],
)
def test_a_url_opod_cannot_use_is_refused_with_the_reason(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message) as caught:
        Store.open(url)
    assert ":pw@" not in str(caught.value)


def test_a_closed_store_says_so(db_url: str) -> None:
    store = Store.open(db_url)
    store.close()
    store.close()
    assert store.closed and repr(store) == "Store(closed)"
    with pytest.raises(StoreError, match="the store is closed; open it again"):
        store.list_keys()


def test_everything_written_survives_a_restart(db_url: str) -> None:
    with Store.open(db_url) as store:
        key = store.create_key(kind="api", name="app", hash=hash_secret("sk-1"), prefix="sk-1", created_at=at(0))
        store.revoke_key(key.id, at(1))
        node = store.upsert_node(
            "node-a",
            hostname="h",
            os="linux",
            arch="arm64",
            ram_gb=8,
            address="a:1",
            hardware_json='{"x": 1}',
            at=at(2),
        )
        store.set_drained("node-a", True, at(3))
        model = store.add_model("m", source_json='{"catalog": "m"}', at=at(4))
        placement = store.set_placement("m", ANY_NODE, "loaded", at=at(5))
        store.set_meta("cluster", "lab")
        assert store.next_boot() == 1
        keys, nodes = store.list_keys(), store.list_nodes()
    assert key.id == keys[0].id and node.id == nodes[0].id
    with Store.open(db_url) as store:
        assert store.list_keys() == keys and keys[0].revoked_at == at(1)
        assert store.list_nodes() == nodes and nodes[0].drained_at == at(3)
        assert store.list_models() == [model]
        assert store.list_placements() == [placement]
        assert store.get_meta("cluster") == "lab"
        assert store.next_boot() == 2


# Each child imports first, says it is ready, then waits for "go", so that the opens really overlap.
OPENER = """
import sys, time
from pathlib import Path
from opod.store import Store
url, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.002)
with Store.open(url) as store:
    print(store.next_boot())
"""


def test_processes_opening_a_new_database_at_once_all_succeed(db_url: str, tmp_path: Path) -> None:
    count = 4
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, db_url, str(tmp_path / f"ready-{i}"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        results = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            child.kill() if child.poll() is None else None
    assert [child.returncode for child in children] == [0] * count, [err for _, err in results]
    assert sorted(int(out) for out, _ in results) == list(range(1, count + 1))
    with Store.open(db_url) as store, store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head()]


def test_threads_opening_one_database_at_once_all_succeed(db_url: str) -> None:
    def open_and_count(_: int) -> int:
        with Store.open(db_url) as store:
            return store.next_boot()

    with ThreadPoolExecutor(max_workers=6) as pool:
        boots = list(pool.map(open_and_count, range(6)))
    assert sorted(boots) == list(range(1, 7))


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "opod.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.set_meta("x", "y")
        with store.engine.connect() as conn:

            def pragma(name: str) -> object:
                return conn.exec_driver_sql(f"PRAGMA {name}").scalar()

            assert pragma("journal_mode") == "wal"
            assert pragma("foreign_keys") == 1
            assert pragma("synchronous") == 1  # NORMAL
            assert pragma("busy_timeout") == 10_000
        assert (tmp_path / "opod.db-wal").exists()
    # WAL is a property of the file: a plain sqlite3 client sees it too.
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_sqlite_writer_waits_for_another_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "opod.db"
    with Store.open(f"sqlite:///{path}") as store:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        blocker.execute("INSERT INTO meta (key, value) VALUES ('held', '1')")
        with ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(store.next_boot)
            time.sleep(0.3)
            assert not waiting.done()  # queued on the busy timeout, not failed
            blocker.execute("COMMIT")
            assert waiting.result(timeout=10) == 1
        blocker.close()
        assert store.get_meta("held") == "1"


def test_a_database_from_a_newer_opod_is_refused(db_url: str) -> None:
    with Store.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match="cannot migrate the store at .*9999.*If a newer opod wrote this database"):
        Store.open(db_url)
