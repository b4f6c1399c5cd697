"""Running a benchmark the way a user does (``python -m bench NAME ...``) and reading back the table it wrote."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args: str, timeout: float = 300.0, module: str = "bench") -> str:
    """``python -m MODULE ARGS`` from the checkout's root; its output, after asserting it exited 0.

    On timeout the run is interrupted as Ctrl-C would (its fleets stop in its ``finally`` blocks), then killed.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_") or k == "OPOD_TEST_POSTGRES_URL"}
    env.update(COLUMNS="200", NO_COLOR="1", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A session of its own: the run's CPU (and its processes ending) never counts in the test process's group,
        # which tests/bench/test_routing_runner.py reads as a router's.
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raise AssertionError(f"python -m {module} {' '.join(args)} ran past {timeout:.0f}s:\n{out[-4000:]}") from None
    assert proc.returncode == 0, f"python -m {module} {' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    print(f"python -m {module} {args[0]}: {time.monotonic() - started:.1f}s")
    return out


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def md_table(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose first column is headed ``first``, each as header → cell."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and _cells(line)[:1] == [first]:
            header = _cells(line)
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(header, _cells(row))))
            return rows
    raise AssertionError(f"no table headed {first!r} in:\n{text[:3000]}")


def by_measure(rows: list[dict[str, str]], first: str = "measure") -> dict[str, dict[str, str]]:
    """A table whose rows are measures and whose columns are paths, as measure → path → cell."""
    return {row[first]: row for row in rows}


def number(cell: str) -> float:
    """The first number in a cell (``1,024 (concurrency 8)`` → 1024.0); fails on a cell with none."""
    found = re.search(r"[-+]?\d[\d,]*(?:\.\d+)?", cell)
    assert found, f"no number in {cell!r}"
    return float(found.group(0).replace(",", ""))
