"""``python -m bench admission`` at its smallest: every case on both event loops, and the two teams' sharing run."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import md_table, number, run_bench


def test_every_case_is_measured_on_both_loops_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench("admission", "--rounds", "2000", "--contended", "2000", "--shared", "200", "--results", str(results))
    text = (results / "admission.md").read_text()
    rows = md_table(text, "case")
    assert len(rows) == 10 and {row["loop"] for row in rows} == {"asyncio", "uvloop"}
    assert all(number(row["µs per request"]) > 0 for row in rows), rows
    teams = {row["team"]: row for row in md_table(text, "team")}
    assert sorted(teams) == ["a", "b"] and all(number(t["admissions"]) > 0 for t in teams.values()), teams
    assert sum(number(t["admissions"]) for t in teams.values()) >= 200
