"""What every repository shares: one transaction per call, error translation, input checks."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from opod.http import fastjson
from opod.store.engine import WRITE_OPTION, mask, reason
from opod.store.errors import InvalidInput, StoreError

MAX_TEXT = 1024  # ids, names and other short fields; JSON documents are not limited


class Repository:
    """Base of the repository mixins that make up :class:`opod.store.Store`."""

    _engine: Engine | None

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine; for the store's own modules and tests."""
        if self._engine is None:
            raise StoreError("the store is closed; open it again with Store.open()")
        return self._engine

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._transaction(write=False) as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction: all of it commits, or none of it (rolled back on any error)."""
        with self._transaction(write=True) as conn:
            yield conn

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Connection]:
        engine = self.engine
        try:
            with engine.connect() as conn:
                if write:
                    conn.execution_options(**{WRITE_OPTION: True})
                with conn.begin():
                    yield conn
        except IntegrityError:
            raise  # the calling method turns it into Conflict or NotFound with the record's name
        except DBAPIError as err:
            raise StoreError(f"store at {mask(engine.url)}: {reason(err)}") from err
        except SQLAlchemyError as err:
            raise StoreError(f"store at {mask(engine.url)}: {err}") from err

    def _upsert(self, table: Table, values: dict[str, Any], *, on: list[str], update: dict[str, Any]) -> Insert:
        """INSERT, or UPDATE ``update`` where the ``on`` columns already exist: one atomic statement.

        Both dialects spell it ON CONFLICT … DO UPDATE, through their own Insert classes.
        """
        if self.engine.dialect.name == "postgresql":
            return postgresql.insert(table).values(values).on_conflict_do_update(index_elements=on, set_=update)
        return sqlite.insert(table).values(values).on_conflict_do_update(index_elements=on, set_=update)

    def _insert_new(self, table: Table, values: dict[str, Any]) -> Insert:
        """INSERT unless a row with the same key is there already (ON CONFLICT DO NOTHING, in either dialect); it
        returns the key's first column for a row it inserted, nothing otherwise."""
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        first = next(iter(table.primary_key.columns))
        return insert(table).values(values).on_conflict_do_nothing().returning(first)

    def _upsert_rows(self, table: Table, *, on: list[str]) -> Insert:
        """One INSERT for many rows (executed with a list of values), each row replacing every other column of
        the row it meets on ``on``: a batch is one statement, compiled once, not one per row."""
        return upsert_rows(self.engine.dialect.name, table, tuple(on))


@functools.cache
def upsert_rows(dialect: str, table: Table, on: tuple[str, ...]) -> Insert:
    """:meth:`Repository._upsert_rows` for ``dialect``, made once."""
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    update = {c.name: insert.excluded[c.name] for c in table.columns if c.name not in on}
    return insert.on_conflict_do_update(index_elements=list(on), set_=update)


def now() -> datetime:
    return datetime.now(UTC)


def when(value: datetime | None, field: str) -> datetime:
    """``value`` in UTC (now when None); a naive datetime is refused, never guessed."""
    if value is None:
        return now()
    return aware(value, field)


def aware(value: datetime, field: str) -> datetime:
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # the usual case, first and cheap: the ledger writes a row per request
    if not isinstance(value, datetime):
        raise InvalidInput(f"{field} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{field} {value.isoformat()} has no timezone; pass an aware datetime (e.g. datetime.now(UTC))"
        )
    return value.astimezone(UTC)


def text_arg(value: str, field: str, *, empty: bool = False) -> str:
    """A short text field: a str, not over MAX_TEXT characters, not empty unless allowed."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, not {type(value).__name__}")
    if not empty and not value.strip():
        raise InvalidInput(f"{field} must not be empty")
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"{field} is {len(value)} characters long; at most {MAX_TEXT} are kept")
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character")
    return value


def json_arg(value: str, field: str) -> str:
    """JSON text, checked to parse and kept exactly as given."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be JSON text (str), not {type(value).__name__}")
    try:
        fastjson.loads(value)
    except ValueError as err:
        raise InvalidInput(f"{field} is not valid JSON: {err}") from None
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character, which PostgreSQL text cannot hold")
    return value


def contains_pattern(text: str) -> str:
    """A ``LIKE`` pattern (escape character ``\\``) matching values that contain ``text`` as it is written."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
