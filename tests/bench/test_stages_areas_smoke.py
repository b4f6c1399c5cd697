"""``python -m bench stages-areas`` at its smallest: each area's two leaders answer, and the table says its share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env["PYTHONPATH"] = str(REPO)
    env["COLUMNS"] = "1000"  # rich's error box unwrapped, whatever the paths' lengths
    return subprocess.run(
        [sys.executable, "-m", "bench", "stages-areas", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_smallest_run_weighs_every_area_asked_and_writes_the_table(tmp_path: Path) -> None:
    small = ["--rate", "40", "--seconds", "0.5", "--rounds", "2", "--warm", "0.2"]
    areas = ["--area", "guard_policy", "--area", "routing"]
    done = _run(*small, *areas, "--results-dir", str(tmp_path), "--name", "areas")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "areas.md").read_text()
    rows = [
        line.split(" | ")
        for line in table.splitlines()
        if line.startswith("| the guard policy") or line.startswith("| prefix routing")
    ]
    assert len(rows) == 2, table
    for row in rows:
        on, off = (int(n) for n in row[1].split(" / "))
        assert on > 0 and off > 0 and int(row[2]) == 0, row  # both leaders answered, none failed
        assert row[6].endswith("%"), row  # the area's share, from the pairs' ratios
    assert "- guard_policy: " in table and "- routing: " in table


def test_an_area_that_cannot_be_taken_out_alone_is_refused_naming_the_option(tmp_path: Path) -> None:
    done = _run("--area", "tenancy", "--results-dir", str(tmp_path), timeout=60)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "--area" in said and "tenancy: not an area that can be taken out alone" in said
