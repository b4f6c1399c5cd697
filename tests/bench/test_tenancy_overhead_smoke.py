"""``python -m bench tenancy-overhead`` at its smallest: the in-process bookkeeping off and on, and the two leaders
(governance off, and on through the management API) each answering the open loop."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import md_table, number, run_bench


def test_both_leaders_answer_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "tenancy-overhead",
        *("--rate", "40", "--seconds", "1", "--rounds", "1", "--requests", "200", "--results", str(results)),
    )
    text = (results / "tenancy-overhead.md").read_text()
    in_process = md_table(text, "")
    assert all(number(row["µs per request"]) > 0 for row in in_process[:2]), in_process
    modes = {row[""]: row for row in md_table(text.split("## End to end")[1], "")}
    for mode in ("off", "on"):
        assert number(modes[mode]["requests"]) > 0 and modes[mode]["errors"] == "0", modes[mode]
    assert (results / "tenancy-overhead.png").is_file()
