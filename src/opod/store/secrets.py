"""Secrets the settings name as ``store:NAME`` (``auth/scim-token``, ``auth/ldap-bind``, ...).

A secret's value is read only by the code that uses it; listings and records carry its name, when it
changed and by whom, never the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput
from opod.store.schema import secrets

VALUE_MAX = 65536
"""Characters of a secret kept: a certificate bundle fits, a stray file does not."""


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A stored secret without its value."""

    name: str
    updated_at: datetime
    updated_by: str


class SecretsRepo(Repository):
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
        with self._write() as conn:
            conn.execute(
                self._upsert(
                    secrets,
                    {
                        "name": record.name,
                        "value": value,
                        "updated_at": record.updated_at,
                        "updated_by": record.updated_by,
                    },
                    on=["name"],
                    update={"value": value, "updated_at": record.updated_at, "updated_by": record.updated_by},
                )
            )
            if audit is not None:
                insert_audit(conn, audit)
        return record

    def get_secret(self, name: str) -> str | None:
        """The secret's value, or None when it was never set."""
        with self._read() as conn:
            return conn.execute(select(secrets.c.value).where(secrets.c.name == name)).scalar()

    def secret_info(self, name: str) -> SecretRecord | None:
        with self._read() as conn:
            row = conn.execute(
                select(secrets.c.name, secrets.c.updated_at, secrets.c.updated_by).where(secrets.c.name == name)
            ).first()
        return None if row is None else SecretRecord(**row._mapping)


__all__ = ["SecretRecord", "SecretsRepo"]
