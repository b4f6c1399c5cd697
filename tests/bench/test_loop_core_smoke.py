"""``python -m bench loop-core`` at its smallest: every placement answered, the table and its plot written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.smoke import md_table, number, run_bench


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="loop-core places processes apart: it needs two CPUs")
def test_the_smallest_run_measures_every_placement_and_writes_the_table(tmp_path: Path) -> None:
    args = ["--rate", "40", "--seconds", "1", "--rounds", "1", "--warm", "0.5", "--workers", "2"]
    run_bench("loop-core", *args, "--results-dir", str(tmp_path), timeout=240)
    table = (tmp_path / "loop-core.md").read_text()
    rows = {row["placement"]: row for row in md_table(table, "placement")}
    assert set(rows) == {"shared", "engines off", "workers and engines off", "workers, engines and client off"}, table
    for row in rows.values():
        assert number(row["requests"]) > 0 and row["errors"] == "0", table
        assert number(row["leader CPU µs/req (median)"]) > 0, table
    assert rows["shared"]["against shared"] == "1.000", table
    assert (tmp_path / "loop-core.png").stat().st_size > 0
