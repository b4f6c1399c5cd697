"""``python -m bench plumbing`` at its smallest: every server answers every request, and the table is written."""

from __future__ import annotations

from pathlib import Path

from bench.plumbing.library_calls import LIBRARY_CALLS
from tests.bench.smoke import md_table, number, run_bench


def test_the_smallest_run_measures_every_server_and_writes_the_table(tmp_path: Path) -> None:
    args = ["--rate", "50", "--seconds", "0.4", "--rounds", "2", "--warm", "0.2", "--results-dir", str(tmp_path)]
    args += ["--warm-requests", "20", "--cold-requests", "3"]
    run_bench("plumbing", *args, timeout=120)
    table = (tmp_path / "plumbing.md").read_text()
    rows = {row["server"]: row for row in md_table(table, "server")}
    assert set(rows) == {"bare answer", "opod answer", "bare relay", "opod relay"}, table
    for row in rows.values():
        assert number(row["requests"]) > 0 and number(row["errors"]) == 0, table
        assert number(row["CPU µs/req (median)"]) > 0, table
    assert "opod's server costs a request **" in table and "over the bare relay" in table
    alone = {row["protocol"]: row for row in md_table(table, "protocol")}
    assert set(alone) == {"bare answer", "bare answer, in a task", "opod answer", "bare client", "opod client"}, table
    for row in alone.values():
        assert number(row["warm µs/req"]) > 0 and number(row["cold µs/req"]) > 0, table
    assert "opod's server adds **" in table and "opod's engine client adds **" in table, table
    calls = {row["call"]: row for row in md_table(table, "call")}
    assert set(calls) == set(LIBRARY_CALLS), table
    for row in calls.values():
        assert number(row["warm µs"]) > 0 and number(row["cold µs"]) > 0, table
    assert table.count("less cold") == sum(name.startswith("now: ") for name in LIBRARY_CALLS), table
