"""Small leader facts as key/value text, and the boot counter."""

from __future__ import annotations

from sqlalchemy import BigInteger, Text, cast, select

from opod.store.base import Repository, text_arg
from opod.store.errors import InvalidInput, StoreError
from opod.store.schema import meta

BOOT_KEY = "boot"


class MetaRepo(Repository):
    def get_meta(self, key: str) -> str | None:
        """The value under ``key``, or None when it was never set."""
        with self._read() as conn:
            return conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar()

    def set_meta(self, key: str, value: str) -> None:
        text_arg(key, "meta key")
        if not isinstance(value, str):
            raise InvalidInput(f"meta value for {key!r} must be text, not {type(value).__name__}")
        statement = self._upsert(meta, {"key": key, "value": value}, on=["key"], update={"value": value})
        with self._write() as conn:
            conn.execute(statement)

    def meta_once(self, key: str, value: str) -> str:
        """The value under ``key``, set to ``value`` first when it has none: the first writer wins, on every leader."""
        text_arg(key, "meta key")
        statement = self._upsert(meta, {"key": key, "value": value}, on=["key"], update={"key": meta.c.key})
        with self._write() as conn:
            conn.execute(statement)
            return str(conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar_one())

    def next_boot(self) -> int:
        """Count one more leader start and return its number (1, 2, …); atomic across processes."""
        increment = {"value": cast(cast(meta.c.value, BigInteger) + 1, Text)}
        statement = self._upsert(meta, {"key": BOOT_KEY, "value": "1"}, on=["key"], update=increment).returning(
            meta.c.value
        )
        with self._write() as conn:
            current = conn.execute(select(meta.c.value).where(meta.c.key == BOOT_KEY)).scalar()
            if current is not None and not (current.isascii() and current.isdigit()):
                # SQLite would cast it to 0 and restart the count; refuse instead.
                raise StoreError(
                    f"meta {BOOT_KEY!r} holds {current!r}, not a boot number; set it to the last boot number"
                )
            return int(conn.execute(statement).scalar_one())
