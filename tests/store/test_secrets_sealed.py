"""Secrets are sealed with the leaders' key before they reach the database, on SQLite and PostgreSQL.

Every leader sharing a store reads what another sealed when it has the same key; a leader with
another key is refused at open, with what to do. Secrets kept in clear by an older opod are sealed
at the first open with a key, and on SQLite their clear text is gone from the file.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from alembic import command
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, insert, select

from opod.security.sealing import SecretsKey
from opod.store import Store, StoreError
from opod.store.migrate import alembic_config
from opod.store.schema import secrets
from tests.store.conftest import T0

SECRET = "scim-tok-sealed-c0ffee-77aa"


def key(tmp_path: Path, name: str = "secrets.key") -> SecretsKey:
    return SecretsKey(Fernet.generate_key(), tmp_path / name)


def raw_value(store: Store, name: str) -> str:
    with store.engine.connect() as conn:
        return str(conn.execute(select(secrets.c.value).where(secrets.c.name == name)).scalar_one())


def test_leaders_with_one_key_read_each_others_secrets_and_the_database_holds_none_in_clear(
    db_url: str, tmp_path: Path
) -> None:
    shared = key(tmp_path)
    with Store.open(db_url, secrets_key=shared) as first, Store.open(db_url, secrets_key=shared) as second:
        first.put_secret("auth/scim-token", SECRET, by="alice")
        assert second.get_secret("auth/scim-token") == SECRET
        stored = raw_value(first, "auth/scim-token")
        assert SECRET not in stored and shared.unseal(stored) == SECRET


def test_a_leader_with_another_key_is_refused_with_what_to_do(db_url: str, tmp_path: Path) -> None:
    with Store.open(db_url, secrets_key=key(tmp_path)) as store:
        store.put_secret("auth/ldap-bind", SECRET)
    other = key(tmp_path, "other.key")
    with pytest.raises(StoreError) as refused:
        Store.open(db_url, secrets_key=other)
    message = str(refused.value)
    assert f"{other.where} (fingerprint {other.fingerprint})" in message
    assert "copy the secrets.key of a leader already using this store" in message and "OPOD_SECRETS_KEY_FILE" in message


def test_a_store_opened_without_the_key_keeps_and_reads_no_secret(db_url: str, tmp_path: Path) -> None:
    with Store.open(db_url, secrets_key=key(tmp_path)) as store:
        store.put_secret("auth/ldap-bind", SECRET)
    with Store.open(db_url) as keyless:
        for call in (lambda: keyless.get_secret("auth/ldap-bind"), lambda: keyless.put_secret("x", "y")):
            with pytest.raises(StoreError, match="opened without the secrets key"):
                call()
        assert keyless.secret_info("auth/ldap-bind") is not None, "what is not secret is still listed"


def test_secrets_kept_in_clear_by_an_older_opod_are_sealed_at_the_next_open(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(connection=conn), "0014")
        conn.execute(insert(secrets).values(name="auth/scim-token", value=SECRET, updated_at=T0, updated_by="alice"))
    engine.dispose()
    sealing = key(tmp_path)
    with Store.open(db_url, secrets_key=sealing) as store:
        assert store.get_secret("auth/scim-token") == SECRET
        assert raw_value(store, "auth/scim-token") != SECRET
        if store.engine.dialect.name == "sqlite":
            database = Path(store.engine.url.database or "")
            files = [database, database.with_name(database.name + "-wal")]
            assert all(path.read_bytes().find(SECRET.encode()) == -1 for path in files if path.exists())
            assert stat.S_IMODE(database.stat().st_mode) == 0o600
