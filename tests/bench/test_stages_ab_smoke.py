"""``python -m bench stages-ab`` at its smallest, this checkout against itself: both leaders answer, the table is written."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_smallest_run_measures_both_leaders_and_writes_the_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env["PYTHONPATH"] = str(REPO)
    args = ["--base", str(REPO), "--rate", "40", "--seconds", "0.5", "--rounds", "2", "--warm", "0.2"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", "stages-ab", *args, "--results-dir", str(tmp_path), "--name", "ab"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "ab.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    for side in ("base", "this"):
        python, answered, errors = rows[side][3], int(rows[side][4]), int(rows[side][5])
        assert answered > 0 and errors == 0, table
        own_p99 = float(rows[side][10].strip(" |"))  # read off each answer's Server-Timing: NaN if none said it
        assert 0 < own_p99 < 1000, table
        assert python == platform.python_version(), table
    assert "pair by pair: median **" in table
    # All on is the stages bench's: its guardrail the settings' guard policy, run in the leader, checked on a record.
    assert "kept bodies, the guard policy (in process; no guardrail webhook) and prefix routing" in table
    assert "each leader's guard policy was checked" in table


def _refused(*args: str) -> str:
    """What ``stages-ab`` with ``args`` said as it refused to start (it must refuse)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "stages-ab", *args],
        cwd=REPO,
        # Wide enough that rich's error box does not wrap the message, whatever the temporary path's length.
        env={**os.environ, "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout[-2000:]
    return done.stdout + done.stderr


def test_a_base_that_is_no_checkout_is_refused_naming_the_option(tmp_path: Path) -> None:
    said = _refused("--base", str(tmp_path))
    assert "--base" in said and "holds no src/opod" in said


def test_a_base_python_that_does_not_run_is_refused_naming_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "bin" / "python"
    said = _refused("--base", str(REPO), "--base-python", str(missing))
    assert "--base-python" in said and f"{missing} does not run" in said
