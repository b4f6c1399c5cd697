"""Secrets the settings name as ``store:NAME`` (``auth/scim-token``, ``auth/ldap-bind``, ...).

A secret's value is read only by the code that uses it; listings and records carry its name, when it
changed and by whom, never the value. The value is sealed with the leaders' secrets key
(:mod:`opod.security.sealing`) before it is written, so the database never holds it in clear; the
store keeps the key's fingerprint and refuses to open for a leader whose key is another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from opod.security.sealing import KEY_FILE, KEY_FILE_VAR, SecretsKey
from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.engine import sqlite_run
from opod.store.errors import InvalidInput, StoreError
from opod.store.schema import meta, secrets

VALUE_MAX = 65536
"""Characters of a secret kept: a certificate bundle fits, a stray file does not."""

SEALING = "fernet"
"""``secrets.sealing`` of a value sealed with the secrets key; "" is a value kept in clear by an older opod."""
KEY_META = "secrets_key"
"""The meta row holding the fingerprint of the key every secret in the store is sealed with."""


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A stored secret without its value."""

    name: str
    updated_at: datetime
    updated_by: str


class SecretsRepo(Repository):
    _secrets_key: SecretsKey | None

    def _key(self) -> SecretsKey:
        if self._secrets_key is None:
            raise StoreError(
                "this store was opened without the secrets key, so it neither keeps nor reads a secret; "
                "open it with Store.open(..., secrets_key=...)"
            )
        return self._secrets_key

    def adopt_secrets_key(self) -> int:
        """Check that the store's secrets are sealed with this store's key, and seal those kept in clear.

        The first key a store is opened with is its key (its fingerprint kept in ``meta``); opening it
        with another raises StoreError saying what to do. Returns how many clear secrets were sealed
        now; on SQLite their clear text is overwritten in the file, not merely freed.
        """
        key = self._key()
        with self._write() as conn:
            conn.execute(_insert_absent(conn, KEY_META, key.fingerprint))
            kept = conn.execute(select(meta.c.value).where(meta.c.key == KEY_META)).scalar_one()
            if kept != key.fingerprint:
                raise StoreError(_other_key(key, kept))
            clear = conn.execute(select(secrets.c.name, secrets.c.value).where(secrets.c.sealing == "")).all()
            for name, value in clear:
                conn.execute(
                    update(secrets).where(secrets.c.name == name).values(value=key.seal(value), sealing=SEALING)
                )
        if clear and self.engine.dialect.name == "sqlite":
            # SQLite zeroes what an update replaces (secure_delete, opod.store.engine), but the clear
            # pages may still be in the WAL: copy the sealed ones into the file and empty it.
            sqlite_run(self.engine, "PRAGMA wal_checkpoint(TRUNCATE);")
        return len(clear)

    def put_secret(
        self, name: str, value: str, *, by: str = "", at: datetime | None = None, audit: AuditRow | None = None
    ) -> SecretRecord:
        """Keep ``value`` as the secret ``name``, replacing the one before."""
        if not isinstance(value, str) or not value:
            raise InvalidInput("a secret's value must be non-empty text")
        if len(value) > VALUE_MAX or "\x00" in value:
            raise InvalidInput(f"a secret's value is at most {VALUE_MAX} characters, with no NUL")
        record = SecretRecord(
            text_arg(name, "secret name"), when(at, "updated_at"), text_arg(by, "updated_by", empty=True)
        )
        sealed = {
            "value": self._key().seal(value),
            "sealing": SEALING,
            "updated_at": record.updated_at,
            "updated_by": record.updated_by,
        }
        with self._write() as conn:
            conn.execute(self._upsert(secrets, {"name": record.name, **sealed}, on=["name"], update=sealed))
            if audit is not None:
                insert_audit(conn, audit)
        return record

    def get_secret(self, name: str) -> str | None:
        """The secret's value, or None when it was never set."""
        key = self._key()
        with self._read() as conn:
            row = conn.execute(select(secrets.c.value, secrets.c.sealing).where(secrets.c.name == name)).first()
        if row is None:
            return None
        if row.sealing != SEALING:
            return str(row.value)  # written in clear by an older leader of this store; sealed at the next start
        try:
            return key.unseal(row.value)
        except ValueError as err:
            raise StoreError(f"secret {name!r}: {err}") from None

    def secret_info(self, name: str) -> SecretRecord | None:
        with self._read() as conn:
            row = conn.execute(
                select(secrets.c.name, secrets.c.updated_at, secrets.c.updated_by).where(secrets.c.name == name)
            ).first()
        return None if row is None else SecretRecord(**row._mapping)


def _insert_absent(conn: Connection, key: str, value: str) -> Insert:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(meta).values(key=key, value=value).on_conflict_do_nothing(index_elements=["key"])


def _other_key(key: SecretsKey, kept: str) -> str:
    return (
        f"the secrets in this store are sealed with another key (fingerprint {kept}) than this leader's, "
        f"{key.where} (fingerprint {key.fingerprint}). Every leader sharing a store needs the same key: copy the "
        f"{KEY_FILE} of a leader already using this store over {key.where}, or name that file with {KEY_FILE_VAR}, "
        "then start again"
    )


__all__ = ["SecretRecord", "SecretsRepo"]
