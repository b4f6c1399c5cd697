"""``python -m bench usage`` and ``python -m bench.usage paths`` at their smallest: every store and every write path.

SQLite always; PostgreSQL where ``OPOD_TEST_POSTGRES_URL`` names a server (``.ci/run`` starts one), and skipped,
saying so, where it does not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.smoke import md_table, number, run_bench

POSTGRES_ENV = "OPOD_TEST_POSTGRES_URL"


def _stores(results: Path) -> dict[str, list[dict[str, str]]]:
    rows = md_table((results / "usage.md").read_text(), "store")
    return {store: [r for r in rows if r["store"] == store] for store in {r["store"] for r in rows}}


def _check_ledger(rows: list[dict[str, str]]) -> None:
    assert [r["offered rows/s"] for r in rows] == ["500", "max"], rows
    for row in rows:
        assert number(row["rows"]) > 0 and number(row["durable rows/s"]) > 0, row
        number(row["end→offered p99 ms"])  # every row the writer made durable was offered on the stream


def test_sqlite_rows_are_made_durable_and_offered_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench("usage", "--seconds", "0.5", "--rate", "500", "--rate", "max", "--no-postgres", "--results", str(results))
    stores = _stores(results)
    assert list(stores) == ["sqlite"]
    _check_ledger(stores["sqlite"])
    assert (results / "usage.png").is_file()


@pytest.mark.skipif(
    not os.environ.get(POSTGRES_ENV, "").strip(), reason=f"no PostgreSQL server: set {POSTGRES_ENV} to measure it"
)
def test_postgresql_rows_are_made_durable_and_offered(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench("usage", "--seconds", "0.5", "--rate", "500", "--rate", "max", "--results", str(results))
    stores = _stores(results)
    assert sorted(stores) == ["postgresql", "sqlite"]
    _check_ledger(stores["postgresql"])


def test_every_write_path_is_timed_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "paths", "--repeats", "1", "--seconds", "0.3", "--commits", "5", "--results", str(results), module="bench.usage"
    )
    rows = md_table((results / "usage-write-paths.md").read_text(), "case")
    ways = {row["way"] for row in rows}
    assert {"os.write", "mmap copy", "commit_records: checked, raw cursor", "checked, SQLAlchemy Core"} <= ways, ways
    assert "as built (unchecked), raw cursor" in ways
    assert all(number(row["median of medians µs"]) > 0 for row in rows), rows
