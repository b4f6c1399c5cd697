"""``python -m bench console`` at its smallest: every page answers, and the table is written."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import md_table, number, run_bench


def test_every_page_is_timed_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "console", *("--nodes", "20", "--keys", "300", "--rounds", "5", "--loads", "1", "--results", str(results))
    )
    rows = {row["page"]: row for row in md_table((results / "console.md").read_text(), "page")}
    assert {"summary", "nodes", "keys", "usage", "audit", "settings"} <= set(rows)
    assert all(number(row["HTML p99 ms"]) > 0 for row in rows.values()), rows
