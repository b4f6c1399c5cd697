"""``python -m bench idle-ab`` at its smallest, this checkout against itself: both leaders answer, the table is written."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import REPO, md_table, number, run_bench


def test_the_smallest_run_measures_both_idle_leaders_and_writes_the_table(tmp_path: Path) -> None:
    args = ["--base", str(REPO), "--seconds", "0.5", "--rounds", "2", "--settle", "0.2", "--results-dir", str(tmp_path)]
    run_bench("idle-ab", *args, timeout=150)
    table = (tmp_path / "idle-ab.md").read_text()
    rows = {row["leader"]: row for row in md_table(table, "leader")}
    assert set(rows) == {"base", "this"}, table
    for row in rows.values():
        assert row["answers after the rounds"] == "yes", table
        assert number(row["CPU ms/s (median)"]) >= 0
    assert "round by round: median **" in table
