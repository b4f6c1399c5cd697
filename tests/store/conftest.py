"""One suite, two databases: every test taking ``store`` or ``db_url`` runs on SQLite and PostgreSQL.

The PostgreSQL cases need ``OPOD_TEST_POSTGRES_URL`` (``.ci/run`` starts a server and sets it);
each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Hashable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, event, make_url
from sqlalchemy.pool import NullPool

from opod.security.sealing import SecretsKey
from opod.store import Store
from opod.store.following import Following
from opod.store.offloop import run_sync

T = TypeVar("T")

POSTGRES_ENV = "OPOD_TEST_POSTGRES_URL"
HOW_TO_RUN_POSTGRES = (
    f"PostgreSQL cases need a server: set {POSTGRES_ENV}=postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB "
    "(a role that may create schemas in DB); .ci/run installs and starts one"
)

T0 = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A fixed instant ``seconds`` after T0, so tests compare exact times."""
    return T0 + timedelta(seconds=seconds)


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A skip mark (rather than a skip inside the fixture) lets pytest fold the report to one line a file.
    if os.environ.get(POSTGRES_ENV, "").strip():
        return
    for item in items:
        if item.get_closest_marker("postgres") and HERE in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=HOW_TO_RUN_POSTGRES))


def postgres_base_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        pytest.skip(HOW_TO_RUN_POSTGRES)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL to a fresh, empty database: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'opod.db'}"
        return
    base = make_url(postgres_base_url()).set(drivername="postgresql+psycopg")
    schema = f"opod_test_{secrets.token_hex(6)}"
    admin = create_engine(base, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        # search_path puts every table, and Alembic's version table, in the test's own schema.
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def backend(db_url: str) -> str:
    return make_url(db_url).get_backend_name()


@pytest.fixture
def open_store(db_url: str) -> Iterator[Callable[[], Store]]:
    """Opens stores on the test's database, all with one secrets key, and closes them all at the end."""
    opened: list[Store] = []

    sealing = SecretsKey(Fernet.generate_key(), Path("secrets.key"))

    def _open() -> Store:
        store = Store.open(db_url, secrets_key=sealing)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[[], Store]) -> Store:
    return open_store()


class Statements(list[str]):
    """The statements a store sends through SQLAlchemy while counting, as a user of ``echo`` would see them."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self._engine = store.engine
        event.listen(self._engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: object, cursor: object, statement: str, *args: object) -> None:
        self.append(statement)

    def stop(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


QUIET_TRIES = 50


NOTICED_S = 0.2
"""Long enough for a change's notice to be counted (PostgreSQL: a moment after its commit, in another thread)."""


async def quietly(store: Store, step: Callable[[], Awaitable[T]]) -> T:
    """``step``'s result, from a run during which nothing was committed that moves the store's commit mark.

    The mark after ``step`` is taken once a notice it caused would be counted. ``step`` is run again (up to
    :data:`QUIET_TRIES` times) until the mark is the same after it as before, as something else may write
    meanwhile; what ``step`` itself commits moves the mark every time, and the test fails.
    """
    for _ in range(QUIET_TRIES):
        before = store.commit_mark()
        result = await step()
        await asyncio.sleep(NOTICED_S)
        if store.commit_mark() == before:
            return result
    raise AssertionError(f"the store's commit mark moved across each of {QUIET_TRIES} runs")


async def moved(store: Store, before: Hashable, within: float = 5.0) -> Hashable:
    """The store's commit mark once it differs from ``before`` (PostgreSQL counts a change a moment after its
    commit); fails when it has not within ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while (mark := await run_sync(store.commit_mark)) == before:
        assert asyncio.get_running_loop().time() < deadline, f"the store's commit mark stayed {before!r}"
        await asyncio.sleep(0.02)
    return mark


async def first_read(following: Following, within: float = 5.0) -> list[str]:
    """What the first look that runs any follower runs (a change is counted a moment after its commit)."""
    deadline = asyncio.get_running_loop().time() + within
    while not (ran := await following.look()):
        assert asyncio.get_running_loop().time() < deadline, "no look ran a follower"
        await asyncio.sleep(0.02)
    return ran
