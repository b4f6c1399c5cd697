"""``python -m bench fleet-scale`` at its smallest: three simulated nodes, two models, a few GETs.

It waits for the models' schedule window to open at the next whole minute (at least 10 s ahead, so up to about 70 s):
that is how the benchmark makes one reconciler pass find every model at once, the pass it times.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import md_table, number, run_bench


def test_the_leader_registers_places_and_answers_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "fleet-scale",
        *("--nodes", "3", "--models", "2", "--cpu-seconds", "2", "--requests", "10", "--latency-seconds", "1"),
        *("--after-seconds", "1", "--results", str(results)),
        timeout=240,
    )
    text = (results / "fleet-scale.md").read_text()
    (row,) = md_table(text, "nodes")
    assert row["nodes"] == "3"
    for column in ("pass s (planning s)", "summary p50 / p99 ms", "nodes p50 / p99 ms", "register s"):
        number(row[column])  # measured, not a dash
    notes = text.split("## Notes")[1]
    assert "did not answer 200" not in notes and "loads arrived" not in notes and "replicas ready" not in notes, notes
    assert "listed" not in notes, notes
    assert (results / "fleet-scale.png").is_file()
