"""Ledger tests run on real files and the real store: SQLite, and PostgreSQL when
``OPOD_TEST_POSTGRES_URL`` is set (the store suite's fixtures, reused)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger
from opod.store import Store
from tests.store import conftest as store_suite
from tests.store.conftest import HOW_TO_RUN_POSTGRES, POSTGRES_ENV

# The store suite's fixtures: every test taking ``store`` or ``db_url`` runs on both databases.
db_url, backend, open_store, store = store_suite.db_url, store_suite.backend, store_suite.open_store, store_suite.store

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The store suite's hook marks its own folder only; fold this folder's PostgreSQL skips the same way.
    if os.environ.get(POSTGRES_ENV, "").strip():
        return
    for item in items:
        if item.get_closest_marker("postgres") and HERE in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=HOW_TO_RUN_POSTGRES))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def open_ledger(store: Store, home: Path) -> Iterator[Callable[..., Ledger]]:
    """Opens ledgers on the test's store and home, and closes them all at the end."""
    opened: list[Ledger] = []

    def _open(**kwargs: object) -> Ledger:
        kwargs.setdefault("keep", timedelta(days=30))
        ledger = Ledger.open(store, home, **kwargs)  # type: ignore[arg-type]
        opened.append(ledger)
        return ledger

    yield _open
    for ledger in opened:
        ledger.close()


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Ledger:
    return open_ledger()


def request(ledger: Ledger, n: int, **end: object) -> None:
    """Begin and end ``n`` requests, ids r0…r{n-1}, tokens from the index."""
    for i in range(n):
        ticket = ledger.begin(request_id=f"r{i}", api_key_id="k_1", user_id="u_1", model="m", protocol="openai")
        ledger.end(ticket, **{"outcome": "ok", "prompt_tokens": i, "completion_tokens": 2 * i, "latency_ms": 10, **end})  # type: ignore[arg-type]
