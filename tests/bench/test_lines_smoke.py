"""``python -m bench lines`` at its smallest: a real all-on leader counts the lines its chats run, and the table is
written; with ``--base`` pointing at this same checkout, both leaders count about the same."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import REPO, md_table, number, run_bench


def test_the_smallest_run_counts_the_lines_of_every_chat_and_writes_the_table(tmp_path: Path) -> None:
    args = ["--requests", "40", "--rate", "40", "--top", "10", "--base", str(REPO), "--results-dir", str(tmp_path)]
    run_bench("lines", *args, timeout=240)
    table = (tmp_path / "lines.md").read_text()
    rows = {row["leader"]: row for row in md_table(table, "leader")}
    assert set(rows) == {"base", "this"}, table
    for row in rows.values():
        assert number(row["requests"]) > 0 and number(row["errors"]) == 0, table
        # A chat passes the server, the gateway, the relay and the ledger: hundreds of lines, in a hundred functions.
        assert number(row["lines run per request"]) > 300 and number(row["functions"]) > 50, table
    this, base = (number(rows[side]["lines run per request"]) for side in ("this", "base"))
    assert abs(this - base) / base < 0.1, table  # the same tree: what is left of the leader's own work is small
    functions = md_table(table, "function")
    assert len(functions) == 10 and any("Gateway.serve" in row["function"] for row in functions), table
    assert "This leader runs **" in table, table
